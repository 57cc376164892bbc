"""One start's reading of a journal, in this process, without a server: how long the
recovery, the restore into a broker and the accounting of what it holds take.

Run from the repository root on a kept data directory (benchmarks/recovery.py --keep,
benchmarks/backlog.py --keep):

    .venv/bin/python benchmarks/recover_once.py /tmp/pairmq-recovery-XXXX/data-recover
    PYTHONPATH=/tmp/old/src .venv/bin/python benchmarks/recover_once.py DIR   # another build

The server's default limits apply (64 MiB a destination, under `page`), unless
--max-size-bytes says otherwise (the head a start keeps in memory is [store]
recovery_in_memory_bytes, --recovery-in-memory-bytes). With --digest, the line also
carries a SHA-256 over what the start rebuilt (every paged log's entries, cursors, sizes
and delivery counts, the messages in memory, the producers): two builds given the same
head must print the same. Prints one JSON line. The journal is read as a start
reads it, so a start's own changes apply (a torn tail cut, an unusable summary removed):
use a copy to keep it as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

from pairmq.core import Broker
from pairmq.core.replay import Replay
from pairmq.server.config import load_config
from pairmq.store.store import Store


def digest(replay: Replay) -> str:
    """A SHA-256 over the state a start rebuilt, in an order that does not depend on how."""
    h = hashlib.sha256()
    for destination, log in sorted(replay.logs.items()):
        h.update(repr((destination, log.start, log.located_end, sorted(log.cursors.items()),
                       sorted(log.held.items()), sorted(log.deliveries.items()),
                       sorted((k, sorted(v)) for k, v in log.skip.items()))).encode())
        for _first, chunk, i in log.chunks_from(log.start):
            for column in (chunk.segment, chunk.offset, chunk.order, chunk.size, chunk.length):
                h.update(column[i:].tobytes())
    for key, held in sorted(replay.queues.items()):
        h.update(repr((key, [(message_id, e.deliveries, e.message.order, e.message.size)
                             for message_id, e in held.items()])).encode())
    h.update(repr(sorted((d, sorted(p.items())) for d, p in replay.producers.items()))
             .encode())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", type=Path)
    ap.add_argument("--max-size-bytes", type=int, default=None)
    ap.add_argument("--recovery-in-memory-bytes", type=int, default=None)
    ap.add_argument("--digest", action="store_true")
    args = ap.parse_args()
    values: dict[str, object] = {"name": "recover", "data_dir": str(args.data_dir),
                                 "allow_anonymous": True}
    if args.max_size_bytes is not None:
        values["max_size_bytes"] = args.max_size_bytes
    if args.recovery_in_memory_bytes is not None:
        values["recovery_in_memory_bytes"] = args.recovery_in_memory_bytes
    config = load_config(None, values, {})
    store = Store(args.data_dir / "journal", config.store_settings())
    broker = Broker(config.core_settings(), id_prefix="ID:recover-")
    started = time.perf_counter()
    replay, report = store.recover(config.core_settings().dup_cache_size_for)
    recovered = time.perf_counter()
    state = digest(replay) if args.digest else None  # before restore, which takes it over
    digested = time.perf_counter()
    broker.restore(replay)
    restored = time.perf_counter()
    store.account(broker)
    accounted = time.perf_counter()
    print(json.dumps({"recover_s": round(recovered - started, 3),
                      "restore_s": round(restored - digested, 3),
                      "account_s": round(accounted - restored, 3),
                      "messages": report.messages, "in_memory": report.in_memory,
                      "summarised_segments": report.summarised,
                      **({"sha256": state} if state else {})}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
