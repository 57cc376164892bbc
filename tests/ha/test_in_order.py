"""The HA channel's reading (server/pair/peer_channel.py `InOrder`): messages are handled
in the order they came, while a slow one (a chunk of records a backup applies in
slices) holds those behind it but not the reading; each waiting message is shown to
`ahead` as it is read, which is how a backup promises on a heartbeat stuck behind
records (docs/ha.md, rule 4). The links here are stand-ins: what InOrder needs of one is
whether it is closed, its peer's name, and closing it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from pairmq.ha import channel as ch
from pairmq.server.pair.peer_channel import InOrder

RECORDS, HEARTBEAT, CONTROL = ch.RECORDS, ch.HEARTBEAT, 99


class StandInLink:
    def __init__(self) -> None:
        self.closed = False
        self.peer = "peer"

    def close(self) -> None:
        self.closed = True


class Recorder:
    """Handles RECORDS slowly (three turns of the loop), the others at once."""

    def __init__(self, fail_on: bytes | None = None) -> None:
        self.handled: list[bytes] = []
        self.ahead: list[bytes] = []
        self.fail_on = fail_on

    def handle(self, link: object, kind: int, payload: bytes) -> Awaitable[None] | None:
        if kind == RECORDS:
            return self._slow(payload)
        self._done(payload)
        return None

    async def _slow(self, payload: bytes) -> None:
        for _ in range(3):
            await asyncio.sleep(0)
        self._done(payload)

    def _done(self, payload: bytes) -> None:
        if payload == self.fail_on:
            raise ch.ChannelError(f"bad {payload.decode()}")
        self.handled.append(payload)

    def saw_ahead(self, link: object, kind: int, payload: bytes) -> None:
        self.ahead.append(payload)


def _in_order(recorder: Recorder, link: StandInLink, current: bool = True) -> InOrder:
    return InOrder(link, recorder.handle, recorder.saw_ahead,  # type: ignore[arg-type]
                   lambda: current and not link.closed)


def test_messages_behind_slow_records_wait_their_turn_and_are_seen_ahead() -> None:
    async def run() -> tuple[Recorder, list[bytes], str | None]:
        recorder, link = Recorder(), StandInLink()
        handling = _in_order(recorder, link)
        handling.add(CONTROL, b"c0")  # nothing slow ahead: handled as it is read
        handling.add(RECORDS, b"r1")
        handling.add(HEARTBEAT, b"h1")
        handling.add(CONTROL, b"c1")
        handled_when_read = list(recorder.handled)
        failure = await handling.finish()
        handling.add(CONTROL, b"c2")  # the slow work is over: at once again
        return recorder, handled_when_read, failure

    recorder, handled_when_read, failure = asyncio.run(run())
    assert handled_when_read == [b"c0"]
    assert recorder.ahead == [b"h1", b"c1"]
    assert recorder.handled == [b"c0", b"r1", b"h1", b"c1", b"c2"]
    assert failure is None


def test_a_protocol_error_in_the_slow_handling_ends_the_link_and_drops_the_rest() -> None:
    async def run() -> tuple[Recorder, StandInLink, str | None]:
        recorder, link = Recorder(fail_on=b"r1"), StandInLink()
        handling = _in_order(recorder, link)
        handling.add(RECORDS, b"r1")
        handling.add(CONTROL, b"c1")
        return recorder, link, await handling.finish()

    recorder, link, failure = asyncio.run(run())
    assert failure == "protocol error: bad r1"
    assert link.closed and recorder.handled == []


def test_what_a_replaced_link_still_carried_is_not_handled() -> None:
    """A newer link replaced this one while its records were being applied: the records
    behind are dropped (the peer sends them again on the new link), never interleaved
    with the new link's."""
    async def run() -> Recorder:
        recorder, link = Recorder(), StandInLink()
        handling = _in_order(recorder, link, current=False)
        handling.add(RECORDS, b"r1")  # already under way when the link was replaced
        handling.add(RECORDS, b"r2")
        await handling.finish()
        return recorder

    assert asyncio.run(run()).handled == [b"r1"]
