"""The store's part of paging (core/paged.py), played in memory for pure core tests: a
paged message's "journal entry" is its object, kept here by (log, entry number).

    pages = Pages()
    pages.sync(broker)          # records on disk: pending log entries are located
    pages.serve(broker, now)    # windows asked for are read back (as new objects)
"""

from __future__ import annotations

import dataclasses

from pairmq.core import Broker, Message


class Pages:
    def __init__(self) -> None:
        self.disk: dict[tuple[int, int], Message] = {}
        self.read = 0  # entries read back

    def sync(self, broker: Broker) -> None:
        for address in list(broker.addresses.values()):
            log = address.log
            if log is None or not log.pending:
                continue
            while log.pending:
                message = log.pending[0]
                number = log.locate(message, 0, 0, 0, 0)
                self.disk[(id(log), number)] = message
            broker.pages_located(log)

    def serve(self, broker: Broker, now: int) -> None:
        """Answer every window asked for, until none is (sync first)."""
        self.sync(broker)
        while wanted := broker.take_page_wanted():
            for q, log, numbers in wanted:
                messages = [dataclasses.replace(self.disk[(id(log), n)], log=None)
                            for n in numbers]
                self.read += len(numbers)
                broker.paged_in(q, numbers, messages, now)
            broker.take_moved_logs()
