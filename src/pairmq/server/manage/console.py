"""The web console on the management port (docs/operations.md, "The console"): one page,
GET /, and its script and style sheet under /console/. Plain HTML and a small script that
polls the operator's JSON API (server/manage/operator_api.py) every 2 s; nothing is fetched from
anywhere else.

The management middleware guards these routes as every other: a browser asks for a user
(the 401's challenge) and then sends the same credentials with the page's own requests.
The files are read once, when the routes are made (they ship with the package).
"""

from __future__ import annotations

from importlib.resources import files

from aiohttp import web

FILES = {"index.html": "text/html", "console.js": "text/javascript",
         "console.css": "text/css"}

# The page may load only its own script and style sheet, talk only to this port, and may
# not be framed by another site (an action is a click away: no clickjacking).
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # a new version is seen at the next load
}


def _load() -> dict[str, bytes]:
    folder = files("pairmq.server.manage") / "console_assets"
    return {name: (folder / name).read_bytes() for name in FILES}


def console_routes() -> list[web.RouteDef]:
    content = _load()

    def answer(name: str) -> web.Response:
        return web.Response(body=content[name], content_type=FILES[name], charset="utf-8",
                            headers=HEADERS)

    async def page(_request: web.Request) -> web.Response:
        return answer("index.html")

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in content:
            raise web.HTTPNotFound(text='{"error": "no such file of the console"}',
                                   content_type="application/json")
        return answer(name)

    async def to_page(_request: web.Request) -> web.Response:
        raise web.HTTPFound("/")

    return [web.get("/", page), web.get("/console", to_page), web.get("/console/", to_page),
            web.get("/console/{name}", static)]
