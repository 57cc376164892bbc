"""Two etcd clients for the pair's lease (issue 36): aiohttp on etcd's JSON gateway (what
server/pair/etcd_arbiter.py uses) and `aetcd` (asyncio on grpc.aio).

    python benchmarks/etcd_clients.py --client gateway
    python benchmarks/etcd_clients.py --client aetcd     # needs `pip install aetcd`

Starts a local 3-member etcd (tests/support/etcd.py), then times --calls compare-and-put
transactions (the lease's renewal) and --calls linearizable reads, one at a time, as the
lease does; reports p50/p99 in ms, the client process's CPU, and how long importing the
client took. aetcd is not a dependency of pairmq: run it from a venv that has it (with
this repository on PYTHONPATH). Results and the choice: docs/ha.md, "Which client".
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import base64  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from tests.support.etcd import EtcdCluster  # noqa: E402

KEY = b"/pairmq/measure/lease"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


async def gateway(endpoint: str, calls: int) -> tuple[list[float], list[float]]:
    import aiohttp
    url = f"http://{endpoint}"
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v3/kv/put", json={"key": _b64(KEY), "value": "eA=="}) as r:
            revision = int((await r.json(content_type=None))["header"]["revision"])
        writes, reads = [], []
        for i in range(calls):
            started = time.perf_counter()
            async with http.post(url + "/v3/kv/txn", json={
                    "compare": [{"key": _b64(KEY), "target": "MOD", "result": "EQUAL",
                                 "mod_revision": str(revision)}],
                    "success": [{"request_put": {"key": _b64(KEY), "value": _b64(b"v%d" % i)}}],
                    "failure": [{"request_range": {"key": _b64(KEY)}}]}) as r:
                answer: dict[str, Any] = await r.json(content_type=None)
            writes.append(time.perf_counter() - started)
            assert answer.get("succeeded"), answer
            revision = int(answer["header"]["revision"])
        for _ in range(calls):
            started = time.perf_counter()
            async with http.post(url + "/v3/kv/range", json={"key": _b64(KEY)}) as r:
                await r.json(content_type=None)
            reads.append(time.perf_counter() - started)
    return writes, reads


async def grpc(endpoint: str, calls: int) -> tuple[list[float], list[float]]:
    import aetcd  # type: ignore[import-not-found]
    host, _, port = endpoint.rpartition(":")
    async with aetcd.Client(host=host, port=int(port)) as client:
        await client.put(KEY, b"x")
        writes, reads = [], []
        for i in range(calls):
            kv = await client.get(KEY)  # the revision to compare (outside the timing)
            started = time.perf_counter()
            ok, _ = await client.transaction(
                compare=[client.transactions.mod(KEY) == kv.mod_revision],
                success=[client.transactions.put(KEY, b"v%d" % i)],
                failure=[client.transactions.get(KEY)])
            writes.append(time.perf_counter() - started)
            assert ok
        for _ in range(calls):
            started = time.perf_counter()
            await client.get(KEY)
            reads.append(time.perf_counter() - started)
    return writes, reads


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--client", choices=["gateway", "aetcd"], required=True)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pairmq-etcd-clients-") as workdir, \
            EtcdCluster(Path(workdir)) as cluster:
        started = time.perf_counter()
        if args.client == "gateway":
            import aiohttp  # noqa: F401
        else:
            import aetcd  # noqa: F401
        imported = time.perf_counter() - started
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu0 = usage.ru_utime + usage.ru_stime
        run = gateway if args.client == "gateway" else grpc
        writes, reads = asyncio.run(run(cluster.endpoints[0], args.calls))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = usage.ru_utime + usage.ru_stime - cpu0
    print(json.dumps({"client": args.client, "calls": args.calls,
                      "import_ms": round(imported * 1000),
                      "txn_p50_ms": _pct(writes, 0.5), "txn_p99_ms": _pct(writes, 0.99),
                      "range_p50_ms": _pct(reads, 0.5), "range_p99_ms": _pct(reads, 0.99),
                      "client_cpu_s": round(cpu, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
