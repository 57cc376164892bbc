"""Fast encoding of the frames the server sends most: MESSAGE, RECEIPT, ERROR.

A message's header block is encoded once per STOMP version and cached on the message,
so a topic with many subscribers or a redelivery does not re-escape anything.
"""

from __future__ import annotations

from pairmq.core import Delivery
from pairmq.protocol import Frame, escape_header, serialize


def _escape(value: str, version: str) -> str:
    return escape_header(value, version) if version != "1.0" else value


def message_block(delivery: Delivery, version: str) -> bytes:
    """Headers that are the same for every delivery of one message, plus its body."""
    message = delivery.entry.message
    wire = message.wire
    if wire is None:
        wire = message.wire = {}
    block = wire.get(version)
    if block is None:
        lines = [f"message-id:{_escape(message.message_id, version)}",
                 f"destination:{_escape(message.destination, version)}"]
        for name, value in message.headers.items():
            lines.append(f"{_escape(name, version)}:{_escape(value, version)}")
        lines.append(f"content-length:{len(message.body)}\n\n")
        block = wire[version] = "\n".join(lines).encode() + message.body + b"\x00"
    return block


def encode_delivery(delivery: Delivery, version: str, sub_line: bytes) -> bytes:
    """MESSAGE frame; `sub_line` is the connection's cached b"MESSAGE\\nsubscription:ID\\n"."""
    block = message_block(delivery, version)
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


def receipt(receipt_id: str, version: str) -> bytes:
    return serialize(Frame("RECEIPT", {"receipt-id": receipt_id}), version)


def error(message: str, version: str, receipt_id: str | None = None, detail: str = "",
          extra: dict[str, str] | None = None) -> bytes:
    headers = {"message": message.replace("\n", " "), "content-type": "text/plain"}
    if receipt_id is not None:
        headers["receipt-id"] = receipt_id
    if extra:
        headers.update(extra)
    body = (detail or message).encode() + b"\n"
    return serialize(Frame("ERROR", headers, body), version)
