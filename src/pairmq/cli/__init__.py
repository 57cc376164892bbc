"""The `pairmq` command (main.py) and its groups of subcommands: the operator's daily
commands (ops.py), users, roles and rules (users.py), requests to management ports
(admin.py), `pairmq up` (up.py) and its local certificate authority (local_ca.py)."""
