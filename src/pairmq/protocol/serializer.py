"""Frame to bytes, the inverse of the parser, built with a few joins per frame."""

from __future__ import annotations

from .escaping import UNESCAPED_COMMANDS, escape_header
from .frame import Frame

HEARTBEAT: bytes = b"\n"


def serialize(frame: Frame, version: str = "1.2") -> bytes:
    """Encode `frame` for a peer speaking `version`.

    Headers are escaped as the version says (never on CONNECT/CONNECTED/STOMP, never in 1.0).
    A content-length header is added when the body is not empty and the frame has none; one
    the caller set is sent unchanged. Where escaping is not in force, a CR or LF in a name or
    value would end the line and let a value forge headers, so each is sent as a space.
    """
    headers = frame.headers
    body = frame.body
    if headers:
        text = "\n".join([f"{name}:{value}" for name, value in headers.items()])
        if version == "1.0" or frame.command in UNESCAPED_COMMANDS:
            if text.count("\n") != len(headers) - 1 or "\r" in text:
                text = "\n".join([
                    f"{_flatten(name)}:{_flatten(value)}" for name, value in headers.items()
                ])
        elif (
            "\\" in text
            or text.count(":") != len(headers)
            or text.count("\n") != len(headers) - 1
            or ("\r" in text and version != "1.1")
        ):
            text = "\n".join([
                f"{escape_header(name, version)}:{escape_header(value, version)}"
                for name, value in headers.items()
            ])
        if body and "content-length" not in headers:
            head = f"{frame.command}\n{text}\ncontent-length:{len(body)}\n\n"
        else:
            head = f"{frame.command}\n{text}\n\n"
    elif body:
        head = f"{frame.command}\ncontent-length:{len(body)}\n\n"
    else:
        head = f"{frame.command}\n\n"
    return b"".join((head.encode(), body, b"\0"))


def _flatten(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")
