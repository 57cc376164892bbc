"""Fast encoding of the frames the server sends most: MESSAGE, RECEIPT, ERROR.

A message's header block is encoded once per STOMP version and cached on the message,
so a topic with many subscribers or a redelivery does not re-escape anything.
"""

from __future__ import annotations

from collections.abc import Callable

from pairmq.core import Delivery, Message
from pairmq.protocol import Frame, escape_header, serialize


def _escape(value: str, version: str) -> str:
    if version != "1.0":
        return escape_header(value, version)
    # STOMP 1.0 has no escapes: a CR or LF would let a sender forge headers, so flatten them.
    if "\n" in value or "\r" in value:
        return value.replace("\r", " ").replace("\n", " ")
    return value


def message_block(delivery: Delivery, version: str,
                  read_body: Callable[[Message], bytes]) -> bytes:
    """Headers that are the same for every delivery of one message, plus its body."""
    message = delivery.entry.message
    wire = message.wire
    if wire is None:
        if message.body is None:  # paged out: read it back, cache nothing
            return _encode_block(message, version, read_body(message))
        wire = message.wire = {}
    block = wire.get(version)
    if block is None:
        block = wire[version] = _encode_block(message, version, message.body or b"")
    return block


def _encode_block(message: Message, version: str, body: bytes) -> bytes:
    # The sender's headers reached us unescaped: usually nothing in them needs escaping, so
    # check the joined text once. Our own message ids hold a colon, so they are escaped alone.
    pairs = message.headers.items()
    text = "\n".join([f"{name}:{value}" for name, value in pairs])
    if ("\\" in text or "\r" in text or text.count("\n") != len(pairs) - 1
            or text.count(":") != len(pairs)):
        text = "\n".join([f"{_escape(name, version)}:{_escape(value, version)}"
                          for name, value in pairs])
    head = (f"message-id:{_escape(message.message_id, version)}\n"
            f"destination:{_escape(message.destination, version)}\n")
    if text:
        head += text + "\n"
    return f"{head}content-length:{len(body)}\n\n".encode() + body + b"\x00"


def encode_delivery(delivery: Delivery, version: str, sub_line: bytes,
                    read_body: Callable[[Message], bytes]) -> bytes:
    """MESSAGE frame; `sub_line` is the connection's cached b"MESSAGE\\nsubscription:ID\\n"."""
    block = message_block(delivery, version, read_body)
    count = delivery.delivery_count
    if delivery.ack_id is None:
        if count == 1:
            return b"".join((sub_line, b"delivery-count:1\n", block))
        return b"".join((sub_line, b"redelivered:true\ndelivery-count:%d\n" % count, block))
    ack = b"ack:%s\n" % delivery.ack_id.encode()
    if count == 1:
        return b"".join((sub_line, ack, b"delivery-count:1\n", block))
    return b"".join((sub_line, ack, b"redelivered:true\ndelivery-count:%d\n" % count, block))


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
