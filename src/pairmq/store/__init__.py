"""The journal: record encoding (records.py), segment files (segments.py), group commit
(writer.py), how long its syncs take (synctimes.py) and whether its disk completes writes
at all (stall.py), the store and its parts (store.py:
appends, liveness and paging; recovery.py, with reading.py and the segment summaries,
summary.py, which summary_builder.py builds as records are appended; compaction.py; a
backup's mirror, mirror.py; what they share, store_state.py; its settings, settings.py),
paged entries and bodies (pages.py, paging.py), the replication stream's framing
(replication_frames.py), the shared store's lock (sharedlock.py), the garbage collector of
a broker that holds millions of messages (gcpause.py), `pairmq journal` (check.py)."""
