"""JSON in and out of the management port's handlers: one place for the body checks and
the error shape ({"error": "...", ...}) every management answer uses."""

from __future__ import annotations

from typing import Any

from aiohttp import web


def problem(status: int, message: str, **extra: Any) -> web.Response:
    """An error answer: HTTP `status`, and a message that names the problem."""
    return web.json_response({"error": message, **extra}, status=status)


async def json_object(request: web.Request) -> dict[str, Any]:
    """The request's body, which must be a JSON object (400 otherwise)."""
    try:
        data = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text='{"error": "the body must be JSON"}',
                                 content_type="application/json") from None
    if not isinstance(data, dict):
        raise web.HTTPBadRequest(text='{"error": "the body must be a JSON object"}',
                                 content_type="application/json")
    return data
