"""The Broker (broker.py): the messaging model's one object, written in parts.

`Broker` is one part per concern, each a class in this package over the state they all
share (`BrokerState`, state.py): subscriptions to queues and topics (subscribing.py),
messages coming in (intake.py), acknowledgements (acking.py), COMMITs applied in slices
(committing.py), a backup's broker following the active's journal (follow.py), sessions
outliving their connection (resume.py), streams (streams.py), paging as a mode
(paging.py), idle destinations (idle.py), the operator's changes (operations.py) and
queues made from configuration (configured.py). What it tells the server besides its
deliveries is a `BrokerEvent` (events.py). The models the parts work on live beside this
package in core/: queue.py, subscription.py, stream_log.py, paged_log.py, session.py,
message.py, commit_ledger.py.

The parts are stacked in one line, each extending the next in the order listed here
(Subscribing, Handover, Intake, Acknowledgements, Committing, Follow, Resume, Streams,
Paging, IdleDestinations, Operations, ConfiguredQueues, then BrokerState): the order of
the MRO the Broker had when it extended them all, so lookups are unchanged. Single
inheritance is what mypyc compiles to a native class (docs/benchmarks.md, "mypyc,
end to end"); no part calls another through `super()`, and every step one part asks of
another is declared in BrokerState, so the order decides nothing else.
"""
