"""pairmq beside RabbitMQ and ActiveMQ: the table and the plot at the top of
docs/benchmarks.md, from the shared bench's results.

    .venv/bin/python ../shared/bench/side_by_side.py --rounds 3 --pairmq-venv .venv \\
        --out side-by-side.jsonl
    .venv/bin/python benchmarks/peers.py side-by-side.jsonl --png docs/peers.png

The runs are the shared bench's (`../shared/bench/README.md`): one load generator, 20k x
1 KiB, window 100, client-individual acks, every broker fresh each round, rounds
interleaved. For each scenario this prints, per broker, the median consumer rate and the
median broker CPU per message, and pairmq's ratio to the best peer as the median of the
per-round ratios (a slow phase of the machine lands on every broker of a round alike).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    title: str
    scenario: str  # the shared bench's letter
    pairmq: str  # which pairmq broker name answers for it


ROWS = (
    Row("durable 1P/1C, receipts", "a", "pairmq"),
    Row("the same on a pair (sync, backup fsync)", "a", "pairmq-pair"),
    Row("durable 4P/4C", "c", "pairmq"),
    Row("non-persistent 1P/1C", "b", "pairmq"),
)
PEERS = ("rabbitmq", "activemq")
NAMES = {"pairmq": "pairmq", "pairmq-pair": "pairmq pair", "rabbitmq": "RabbitMQ",
         "activemq": "ActiveMQ"}


@dataclass(frozen=True)
class Figure:
    rate: float  # consumer msgs/s
    cpu_us: float  # broker CPU per message


def load(paths: list[str]) -> dict[tuple[str, str, int], Figure]:
    """(broker, scenario, round) -> figures; runs that were not ok are left out, said so."""
    runs = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                key = (r["broker"], r["scenario"], r["round"])
                if not r.get("ok"):
                    print(f"left out, not ok: {r.get('label')}", file=sys.stderr)
                    continue
                runs[key] = Figure(r["consumer_msgs_per_s"],
                                   r["broker_cpu_secs"] / r["messages"] * 1e6)
    return runs


def median_of(runs: dict[tuple[str, str, int], Figure], broker: str, scenario: str,
              field: str) -> float | None:
    values = [getattr(f, field) for (b, s, _), f in runs.items() if b == broker and s == scenario]
    return statistics.median(values) if values else None


def ratio_to_best_peer(runs: dict[tuple[str, str, int], Figure], row: Row,
                       field: str) -> tuple[float, str] | None:
    """Median over rounds of pairmq's figure over the best peer's of that round (the
    highest rate, the lowest CPU); the peer that was best in most rounds is named."""
    rounds = sorted({k[2] for k in runs if k[0] == row.pairmq and k[1] == row.scenario})
    ratios, bests = [], []
    for rnd in rounds:
        peers = {p: getattr(runs[(p, row.scenario, rnd)], field)
                 for p in PEERS if (p, row.scenario, rnd) in runs}
        if not peers:
            continue
        best = (max if field == "rate" else min)(peers, key=lambda p: peers[p])
        ratios.append(getattr(runs[(row.pairmq, row.scenario, rnd)], field) / peers[best])
        bests.append(best)
    if not ratios:
        return None
    return statistics.median(ratios), max(set(bests), key=bests.count)


def table(runs: dict[tuple[str, str, int], Figure]) -> str:
    lines = ["| scenario | pairmq msgs/s | RabbitMQ | ActiveMQ | pairmq / best peer (rate) "
             "| CPU µs/msg: pairmq | RabbitMQ | ActiveMQ | pairmq / best peer (CPU) |",
             "|---|---|---|---|---|---|---|---|---|"]

    def cell(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    for row in ROWS:
        rate = ratio_to_best_peer(runs, row, "rate")
        cpu = ratio_to_best_peer(runs, row, "cpu_us")
        lines.append(
            f"| {row.title} | {cell(median_of(runs, row.pairmq, row.scenario, 'rate'), ',.0f')} "
            + " ".join(f"| {cell(median_of(runs, p, row.scenario, 'rate'), ',.0f')}"
                       for p in PEERS)
            + f" | {'-' if rate is None else f'{rate[0]:.2f}x {NAMES[rate[1]]}'} "
            f"| {cell(median_of(runs, row.pairmq, row.scenario, 'cpu_us'), '.0f')} "
            + " ".join(f"| {cell(median_of(runs, p, row.scenario, 'cpu_us'), '.0f')}"
                       for p in PEERS)
            + f" | {'-' if cpu is None else f'{cpu[0]:.2f}x {NAMES[cpu[1]]}'} |")
    rounds = len({k[2] for k in runs})
    return "\n".join(lines) + f"\n\nMedians of {rounds} interleaved rounds."


def plot(runs: dict[tuple[str, str, int], Figure], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    titles = [r.title.replace(" (sync, backup fsync)", "\n(peers: one server)")
              .replace(", receipts", "") for r in ROWS]
    width = 0.27
    brokers = ("pairmq", *PEERS)
    colours = {"pairmq": "#2b6cb0", "rabbitmq": "#dd6b20", "activemq": "#718096"}
    for ax, field, label in ((axes[0], "rate", "messages/s received and acked (higher is better)"),
                             (axes[1], "cpu_us", "broker CPU µs per message (lower is better)")):
        for i, broker in enumerate(brokers):
            values = []
            for row in ROWS:
                name = row.pairmq if broker == "pairmq" else broker
                values.append(median_of(runs, name, row.scenario, field) or 0.0)
            xs = [x + (i - 1) * width for x in range(len(ROWS))]
            bars = ax.bar(xs, values, width, label=NAMES[broker], color=colours[broker])
            ax.bar_label(bars, labels=[f"{v / 1000:.1f}k" if field == "rate" else f"{v:.0f}"
                                       for v in values], fontsize=6, padding=1)
        ax.set_xticks(range(len(ROWS)))
        ax.set_xticklabels(titles, fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("pairmq beside its peers: 20k x 1 KiB, window 100, client-individual acks, "
                 "one machine", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="+", help="the shared bench's JSON lines")
    p.add_argument("--png", default=None, help="write the plot here")
    args = p.parse_args(argv)
    runs = load(args.results)
    if not runs:
        print("no successful runs in the results", file=sys.stderr)
        return 1
    print(table(runs))
    if args.png:
        plot(runs, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
