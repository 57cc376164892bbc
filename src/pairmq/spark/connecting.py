"""Opening the failover client where the data source needs one, and the errors a user
meets there: an unreachable pair (naming the servers and their answers) and an unknown
stream (naming the option)."""

from __future__ import annotations

from pairmq.client import Client, ConnectionFailed, ServerError, connect
from pairmq.spark.options import SourceOptions


class PairmqError(RuntimeError):
    """The pair cannot be used as the query needs (unreachable, unknown stream): the message
    names the servers tried or the stream."""


def open_client(options: SourceOptions, what: str) -> Client:
    """A connected failover client, or PairmqError naming the servers and their answers.

    `what` only names it in errors: the client keeps its random name (the producer id of
    what it sends is its name plus a random part, unique either way)."""
    url, keywords = options.connect_arguments()
    try:
        return connect(url, **keywords)
    except ConnectionFailed as e:
        raise PairmqError(f"pairmq ({what}): no server of option servers={url!r} serves: {e}"
                          ) from None


def stream_offsets(client: Client, options: SourceOptions) -> tuple[int, int]:
    """(first, next) offsets of the option's stream, asked of the active server."""
    try:
        return client.stream_info(options.stream, must_exist=options["mustExist"])
    except ServerError as e:
        said = e.frame.headers.get("message", str(e)) if e.frame is not None else str(e)
        raise PairmqError(f"pairmq: option stream={options['stream']!r}: {said} (servers "
                          f"{options['servers']!r}; option mustExist=false creates it)"
                          ) from None


# Below this a timestamp is before 1973-03-03 in ms, and the server reads it as seconds
# (x-stream-offset timestamp=...): every record of a stream is later, so it is `first`.
SECONDS_BELOW = 10**11


def offset_at_time(client: Client, options: SourceOptions, ms: int,
                   timeout: float = 30.0) -> int:
    """The offset of the option stream's first record appended at or after `ms` (ms since the
    epoch), or its next offset when there is none yet (what is appended next is later).

    The server finds it (x-stream-offset: timestamp=MS, a search over its append times): a
    SUBSCRIBE starting there and bounded by the stream's next offset, with a window of one,
    is handed either that record, whose x-stream-offset is the answer, or at once the range's
    end marker (no record at or after `ms`). Only the first frame is read."""
    first, next_offset = stream_offsets(client, options)
    if ms < SECONDS_BELOW or first >= next_offset:
        return first
    headers = {"x-stream-offset": f"timestamp={ms}", "x-stream-end-offset": str(next_offset),
               "prefetch-count": "1"}
    if options["mustExist"]:
        headers["x-stream-must-exist"] = "true"
    try:
        sub = client.subscribe(options.stream, ack="auto", headers=headers)
        try:
            message = sub.receive(timeout)
        finally:
            sub.unsubscribe()
    except ServerError as e:
        said = e.frame.headers.get("message", str(e)) if e.frame is not None else str(e)
        raise PairmqError(f"pairmq: finding the offset of time {ms} in {options.stream}: "
                          f"{said}") from None
    if message is None:
        raise PairmqError(f"pairmq: finding the offset of time {ms} in {options.stream}: no "
                          f"answer in {timeout:.0f} s (servers {options['servers']!r})")
    if message.headers.get("x-stream-end") == "true":
        return next_offset
    return int(message.headers["x-stream-offset"])
