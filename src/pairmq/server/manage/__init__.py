"""The management port: the HTTP(S) app (admin.py) and what it serves: status
(status.py), Prometheus metrics (metrics.py), the operator's JSON API (operator_api.py),
users, roles and rules at run time (users_api.py), the web console (console.py, its files
in console_assets/); JSON bodies (httpjson.py); and the one interface they ask of the
server (managed_server.py), so that none of them imports the server."""
