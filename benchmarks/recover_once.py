"""One start's reading of a journal, in this process, without a server: how long the
recovery, the restore into a broker and the accounting of what it holds take.

Run from the repository root on a kept data directory (benchmarks/recovery.py --keep,
benchmarks/backlog.py --keep):

    .venv/bin/python benchmarks/recover_once.py /tmp/pairmq-recovery-XXXX/data-recover
    PYTHONPATH=/tmp/old/src .venv/bin/python benchmarks/recover_once.py DIR   # another build

The server's default limits apply (64 MiB a destination, under `page`), unless
--max-size-bytes says otherwise. Prints one JSON line. The journal is read as a start
reads it, so a start's own changes apply (a torn tail cut, an unusable summary removed):
use a copy to keep it as it is.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pairmq.core import Broker
from pairmq.server.config import load_config
from pairmq.store.store import Store


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", type=Path)
    ap.add_argument("--max-size-bytes", type=int, default=None)
    args = ap.parse_args()
    values: dict[str, object] = {"name": "recover", "data_dir": str(args.data_dir),
                                 "allow_anonymous": True}
    if args.max_size_bytes is not None:
        values["max_size_bytes"] = args.max_size_bytes
    config = load_config(None, values, {})
    store = Store(args.data_dir / "journal", config.store_settings())
    broker = Broker(config.core_settings(), id_prefix="ID:recover-")
    started = time.perf_counter()
    replay, report = store.recover(config.core_settings().dup_cache_size_for)
    recovered = time.perf_counter()
    broker.restore(replay)
    restored = time.perf_counter()
    store.account(broker)
    accounted = time.perf_counter()
    print(json.dumps({"recover_s": round(recovered - started, 3),
                      "restore_s": round(restored - recovered, 3),
                      "account_s": round(accounted - restored, 3),
                      "messages": report.messages, "in_memory": report.in_memory,
                      "summarised_segments": report.summarised}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
