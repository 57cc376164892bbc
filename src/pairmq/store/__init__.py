"""The journal: record encoding (records.py), segment files (segments.py), group commit
(writer.py), recovery (reading.py, summary.py), compaction and paging (store.py, pages.py,
paging.py), a backup's mirror (mirror.py), the replication stream's framing
(replication_frames.py), the shared store's lock (sharedlock.py), `pairmq journal`
(check.py)."""
