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
