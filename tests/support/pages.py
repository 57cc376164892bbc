"""The store's part of paging (core/paged_log.py), played in memory for pure core tests: a
paged message's "journal entry" is its object, kept here by (log, entry number).

    pages = Pages()
    pages.sync(broker)          # records on disk: pending log entries are located
    pages.serve(broker, now)    # windows asked for are read back (as new objects)

A stream's records are paged entries too (all of them): `sync` locates them, `serve`
answers the stream readers that reached records held only "on disk".
"""

from __future__ import annotations

import dataclasses

from pairmq.core import Broker, Message


class Pages:
    def __init__(self) -> None:
        self.disk: dict[tuple[int, int], Message] = {}
        self.read = 0  # entries read back

    def sync(self, broker: Broker) -> None:
        logs = [a.log for a in broker.addresses.values() if a.log is not None]
        logs += [stream.log for stream in broker.streams.values()]
        for log in logs:
            if not log.pending:
                continue
            while log.pending:
                message = log.pending[0]
                stamp = int(message.headers.get("timestamp", "0")) if log.stamped else None
                number = log.locate(message, 0, 0, 0, 0, stamp)
                message.log = None
                self.disk[(id(log), number)] = message
            broker.pages_located(log)

    def record(self, log: object, number: int) -> Message:
        """Entry `number` of `log` as the store reads it back: a new object."""
        return dataclasses.replace(self.disk[(id(log), number)], log=None)

    def serve(self, broker: Broker, now: int) -> None:
        """Answer every window asked for, until none is (sync first)."""
        self.sync(broker)
        while wanted := broker.take_page_wanted():
            for q, log, numbers in wanted:
                messages = [self.record(log, n) for n in numbers]
                self.read += len(numbers)
                broker.paged_in(q, numbers, messages, now)
            broker.take_moved_logs()
        while reads := broker.take_stream_reads(1 << 30):
            for cursor, offsets in reads:
                log = cursor.stream.log
                records = [self.record(log, n) for n in offsets]
                self.read += len(offsets)
                broker.stream_read(cursor, offsets, records)
