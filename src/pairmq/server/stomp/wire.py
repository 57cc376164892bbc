"""Fast encoding of the frames the server sends most: MESSAGE, RECEIPT, ERROR.

A message's header lines are encoded once and cached on the message (for the version of
its last delivery), so a topic with many subscribers or a redelivery does not re-escape
anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from pairmq.core import Delivery, Message
from pairmq.core.stream_log import BATCH_HEADER, OFFSET_HEADER, StreamBatch
from pairmq.protocol import Frame, escape_header, serialize
from pairmq.protocol.batch import append_record, header_block

log = logging.getLogger("pairmq.connection")

# a record's own headers in a batch body: the fixed part carries these two
_NOT_IN_RECORD: Final = frozenset({OFFSET_HEADER, "timestamp"})


def _escape(value: str, version: str) -> str:
    if version != "1.0":
        if "\\" in value or "\n" in value or "\r" in value:
            return escape_header(value, version)
        # the usual case, a message id's colons, without a call per message
        return value.replace(":", "\\c") if ":" in value else value
    # STOMP 1.0 has no escapes: a CR or LF would let a sender forge headers, so flatten them.
    if "\n" in value or "\r" in value:
        return value.replace("\r", " ").replace("\n", " ")
    return value


def message_parts(message: Message, version: str,
                  read_body: Callable[[Message], bytes]) -> tuple[bytes, bytes]:
    """A MESSAGE's header lines that are the same for every delivery of one message (through
    the blank line), and its body. The lines are cached on the message, without the body:
    a delivery joins them once, so the body is copied once, not three times, and a message
    waiting for its ack does not hold a second copy of its body."""
    body = message.body
    if body is None:  # paged out: read it back, cache nothing
        body = read_body(message)
        return _encode_head(message, version, len(body)), body
    head = message.wire
    if head is None or message.wire_version != version:
        head = message.wire = _encode_head(message, version, len(body))
        message.wire_version = version
    return head, body


def _encode_head(message: Message, version: str, body_length: int) -> bytes:
    # The sender's headers reached us unescaped: usually nothing in them needs escaping, so
    # check the joined text once. Our own message ids hold a colon, so they are escaped alone.
    headers = message.headers
    # a dict, so that the compiled build iterates it natively (a recovered message's are
    # PackedHeaders until then)
    plain: dict[str, str] = headers if isinstance(headers, dict) else dict(headers)
    if version == "1.0" and any(":" in name for name in plain):
        plain = dict(_for_stomp_10(message))
    text = "\n".join([f"{name}:{value}" for name, value in plain.items()])
    if ("\\" in text or "\r" in text or text.count("\n") != len(plain) - 1
            or text.count(":") != len(plain)):
        text = "\n".join([f"{_escape(name, version)}:{_escape(value, version)}"
                          for name, value in plain.items()])
    head = (f"message-id:{_escape(message.message_id, version)}\n"
            f"destination:{_escape(message.destination, version)}\n")
    if text:
        head += text + "\n"
    return f"{head}content-length:{body_length}\n\n".encode()


def _for_stomp_10(message: Message) -> list[tuple[str, str]]:
    """STOMP 1.0 has no escapes: a header name holding a colon (`na\\cme` from a 1.1 or 1.2
    sender) would reach a 1.0 subscriber as another header (`na:me:v`). Such headers are
    left out of its MESSAGE, and said so."""
    dropped = [name for name in message.headers if ":" in name]
    log.info("Message %s: header(s) %s left out of its delivery to a STOMP 1.0 subscriber "
             "(a colon in a header name cannot be written in 1.0)", message.message_id,
             ", ".join(repr(name) for name in dropped))
    return [(name, value) for name, value in message.headers.items() if ":" not in name]


def encode_delivery(delivery: Delivery, version: str, sub_line: bytes,
                    read_body: Callable[[Message], bytes]) -> bytes:
    """MESSAGE frame; `sub_line` is the connection's cached b"MESSAGE\\nsubscription:ID\\n"."""
    head, body = message_parts(delivery.entry.message, version, read_body)
    count = delivery.delivery_count
    if delivery.ack_id is None:
        if count == 1:
            return b"".join((sub_line, b"delivery-count:1\n", head, body, b"\x00"))
        return b"".join((sub_line, b"redelivered:true\ndelivery-count:%d\n" % count, head,
                         body, b"\x00"))
    ack = b"ack:%s\n" % delivery.ack_id.encode()
    if count == 1:
        return b"".join((sub_line, ack, b"delivery-count:1\n", head, body, b"\x00"))
    return b"".join((sub_line, ack, b"redelivered:true\ndelivery-count:%d\n" % count, head,
                     body, b"\x00"))


def encode_browsed(message: Message, version: str, sub_line: bytes,
                   read_body: Callable[[Message], bytes]) -> bytes:
    """MESSAGE frame of a queue browser (core/browsing.py): no ack header, as nothing is
    taken."""
    head, body = message_parts(message, version, read_body)
    return b"".join((sub_line, head, body, b"\x00"))


def browse_end(destination: str, version: str, sub_line: bytes) -> bytes:
    """The MESSAGE that ends a browse, as ActiveMQ sends it: `browser:end`, no body."""
    return b"".join((sub_line, (f"message-id:browse-end\n"
                                f"destination:{_escape(destination, version)}\n"
                                f"browser:end\ncontent-length:0\n\n").encode(), b"\x00"))


def encode_batch(batch: StreamBatch, version: str, sub_line: bytes,
                 read_bodies: Callable[[list[Message]], list[bytes | memoryview]]) -> bytes:
    """A batched stream MESSAGE (x-stream-batch): the frame's headers name the first
    record; the body packs all of them (protocol/batch.py), each with its own offset (a
    filtering subscription's are not consecutive)."""
    messages = batch.messages
    parts: list[bytes | memoryview] = [b""]  # the frame's head goes first, once sized
    skip = _NOT_IN_RECORD
    for message, body in zip(messages, read_bodies(messages), strict=True):
        headers = message.headers  # a stream record's headers carry its offset
        block = header_block([(k, v) for k, v in headers.items() if k not in skip])
        append_record(parts, int(headers[OFFSET_HEADER]), int(headers.get("timestamp", "0")),
                      message.message_id, block, body)
    size = sum(len(p) for p in parts)
    first = messages[0]
    ack = b"" if batch.ack_id is None else b"ack:%s\n" % batch.ack_id.encode()
    parts[0] = b"".join((sub_line, ack, (
        f"message-id:{_escape(first.message_id, version)}\n"
        f"destination:{_escape(first.destination, version)}\n"
        f"{OFFSET_HEADER}:{batch.offset}\n{BATCH_HEADER}:{len(messages)}\n"
        f"content-length:{size}\n\n").encode()))
    parts.append(b"\x00")
    return b"".join(parts)


def subscription_line(sub_id: str, version: str) -> bytes:
    return f"MESSAGE\nsubscription:{_escape(sub_id, version)}\n".encode()


def receipt(receipt_id: str, version: str, extra: dict[str, str] | None = None) -> bytes:
    """RECEIPT; `extra`: more headers (a stream SUBSCRIBE's offsets)."""
    if extra is None and (receipt_id.isalnum() or receipt_id.replace("-", "").isalnum()):
        return b"RECEIPT\nreceipt-id:%s\n\n\x00" % receipt_id.encode()
    return serialize(Frame("RECEIPT", {"receipt-id": receipt_id, **(extra or {})}), version)


def error(message: str, version: str, receipt_id: str | None = None, detail: str = "",
          extra: dict[str, str] | None = None) -> bytes:
    headers = {"message": message.replace("\n", " "), "content-type": "text/plain"}
    if receipt_id is not None:
        headers["receipt-id"] = receipt_id
    if extra:
        headers.update(extra)
    body = (detail or message).encode() + b"\n"
    return serialize(Frame("ERROR", headers, body), version)
