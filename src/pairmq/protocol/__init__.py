"""Sans-IO STOMP 1.0/1.1/1.2: bytes in, frames out, and back. No sockets, no event loop."""

from .errors import ProtocolError
from .escaping import escape_header, unescape_header
from .frame import Frame
from .heartbeat import HeartbeatClock, negotiate_heart_beat, parse_heart_beat
from .parser import FrameParser
from .serializer import HEARTBEAT, serialize
from .session import ClientSession, SessionState
from .versions import SUPPORTED_VERSIONS, negotiate_version

__all__ = [
    "HEARTBEAT",
    "SUPPORTED_VERSIONS",
    "ClientSession",
    "Frame",
    "FrameParser",
    "HeartbeatClock",
    "ProtocolError",
    "SessionState",
    "escape_header",
    "negotiate_heart_beat",
    "negotiate_version",
    "parse_heart_beat",
    "serialize",
    "unescape_header",
]
