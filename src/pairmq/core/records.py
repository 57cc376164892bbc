"""Durable state changes the broker reports, for the store to journal (and later replicate).

Each is a tuple whose first item is one of these kinds; objects are passed by
reference so the store can track where each one's newest record lives. The kinds are
Final: the compiled build writes them into its callers as constants.
"""

from typing import Any, Final

Record = tuple[Any, ...]  # (kind, fields...) as listed below

ADD: Final = 1  # (ADD, message, [queue keys])  a persistent message enters durable queues
DEL: Final = 2  # (DEL, queue key, message)  it leaves one of them
# (DELIVERED, queue key, message, n)  handed out for the n-th time, not yet acked
DELIVERED: Final = 3
DURABLE: Final = 4  # (DURABLE, key, topic)  a durable subscription is created
UNDURABLE: Final = 5  # (UNDURABLE, key)  ... or deleted
DEST: Final = 6  # (DEST, destination[, settings])  a queue is created (settings: its x-
#   arguments as header lines, core/broker/configured.py)
DUP: Final = 7  # (DUP, destination, dup id)  a duplicate id is remembered
# (DUP_EVICT, destination, dup id)  ... and forgotten (bookkeeping, not written)
DUP_EVICT: Final = 8
GROUP: Final = 9  # (GROUP, stream, group, offset)  a stream's consumer group processed < offset
# (PRODUCER, destination, producer, epoch, seq, ms)  a producer's messages up to seq are taken
PRODUCER: Final = 10
PRODUCER_FORGET: Final = 11  # (PRODUCER_FORGET, destination, producer)  ... expired (bookkeeping)
USER: Final = 12  # (USER, name, password hash, roles)  a user added or changed at run time
UNUSER: Final = 13  # (UNUSER, name)  ... or removed (core/accounts.py)
RULE: Final = 14  # (RULE, pattern, ((permission, roles), ...))  a permission rule set at run time
UNRULE: Final = 15  # (UNRULE, pattern)  ... or removed
UNDEST: Final = 16  # (UNDEST, destination)  an empty, unused queue is deleted
# A COMMIT applied in slices (core/broker/committing.py): its sends journaled, then decided,
# then routed a slice at a time; recovery routes the rest of a decided one.
TX_SEND: Final = 17  # (TX_SEND, run, pending send)  one of its sends, before the decision
TX_END: Final = 18  # (TX_END, run)  decided: every send is journaled
TX_DONE: Final = 19  # (TX_DONE, run, routed)  its first `routed` sends are routed
TX_DROP: Final = 20  # (TX_DROP, run)  never decided: its sends mean nothing
