"""Seeded runs of the HA simulator (pairmq.ha.sim): random faults (cuts, one-way cuts,
crashes losing what was not fsynced, pauses, witness restarts, late witness requests)
on the real replication machine, every step checked against the invariants, and the
pair must form again once everything healed; the same with etcd as the arbiter (its
leader lost, its majority lost, members cut from servers and from each other:
ha/sim/etcd.py). Many more seeds: `make sim SEEDS=100000`."""

from __future__ import annotations

import multiprocessing
from functools import partial

import pytest

from pairmq.ha.sim.runner import run_seed

# `make test` runs a few hundred (CI stays under 25 minutes), `make test-long` the rest
SEEDS = range(150)  # two processes, about 6 s on this machine (docs/benchmarks.md)
MORE_SEEDS = range(150, 5000)  # `make test-long`: about 2.9 min more
ETCD_SEEDS = range(50)  # etcd as the arbiter: two processes, 3 to 4 s
MORE_ETCD_SEEDS = range(50, 4300)  # `make test-long`: about 3 min more

# Seeds that found bugs, fixed in ha/ (each fails on the code before its fix).
FIXED = {
    52: "a SYNCING server whose active stopped serving waited forever",
    150: "an active paused while its backup took over kept serving its older history",
    417: "a backup was declared in sync (and so eligible) before it held the records its "
         "active had confirmed alone",
    609: "a renewal delivered late to the witness named again a standby that was out of sync",
    92: "a backup of an active that stepped down went on saying PASSIVE; the pair never formed",
    9881: "a PASSIVE server whose takeover was refused after its channel reconnected "
          "went back to PASSIVE over the new channel, following nothing; the pair never "
          "formed",
    31169: "a backup restarted within an activation interval of its crash took over from "
           "the isolated active at once, while the active still confirmed on the promise "
           "the backup gave before the crash",
    429: "a server elected with its peer while the witness was away picked the epoch the "
         "witness granted its peer meanwhile: two histories shared an epoch",
    6311: "a server elected with its peer while the witness did not answer activated on a "
          "decision taken before the peer's latest hello: a confirmed message was lost",
    7217: "the peer's journal grew between the election and the end of recovery, and the "
          "server activated with the shorter history: a confirmed message was lost",
    10715: "a server elected with its peer served it a synchronisation after the peer had "
           "taken over through the witness at a lower epoch and confirmed alone: the copy "
           "wiped a confirmed message",
    36008: "after a restart the pair elected, without the witness, the journal with the "
           "higher epoch, opened by an election the witness never heard of, over the one "
           "the witness granted a lower epoch later, which held confirmed messages",
    81279: "a failback cut short left both servers WAITING with one journal: the primary "
           "waited for the witness's last holder, the backup, which deferred to the "
           "primary, the election's winner; the pair never formed",
    98108: "an elected server left `elected` on a stale synchronisation request, and "
           "served on a new channel with neither lease nor promise: its copy wiped the "
           "epoch the witness had granted the backup meanwhile, with a confirmed message",
    3011: "an active whose disk stalled handed over while the witness was down, and the "
          "link was cut after \"go\": the backup gave up taking over and waited for the "
          "witness's holder, the old active, which deferred to the backup for ever",
}


# Seeds with etcd as the arbiter that found bugs, fixed in ha/.
FIXED_ETCD = {
    50161: "a server paused while taking over came back to TAKING_OVER after its peer had "
           "served a new epoch on a new channel, and waited for ever for a lease the peer "
           "kept renewing; the pair never formed",
}


def _run(seed: int, arbiter: str = "witness") -> tuple[int, bool, str]:
    result = run_seed(seed, arbiter=arbiter)
    return seed, result.ok, "" if result.ok else f"{result.problem}\n{result.trace}"


def _run_all(seeds: range, arbiter: str = "witness") -> None:
    with multiprocessing.get_context("fork").Pool(2) as pool:
        failed = [(seed, why) for seed, ok, why
                  in pool.imap_unordered(partial(_run, arbiter=arbiter), seeds, 50) if not ok]
    replay = "" if arbiter == "witness" else f" --arbiter {arbiter}"
    assert not failed, "\n".join(f"seed {seed}: {why}\nreplay: python -m pairmq.ha.sim "
                                  f"--seed {seed} --trace{replay}" for seed, why in failed[:3])


@pytest.mark.machine  # two busy processes: make test runs it alone, after the others
@pytest.mark.timeout(300)  # about 21 s on an idle machine, 45 s when it is shared
def test_seeded_runs_keep_the_invariants() -> None:
    _run_all(SEEDS)


@pytest.mark.long
@pytest.mark.timeout(900)
def test_more_seeded_runs_keep_the_invariants() -> None:
    _run_all(MORE_SEEDS)


@pytest.mark.machine
@pytest.mark.timeout(300)  # 15 to 20 s (20 s beside a running `make sim`)
def test_seeded_runs_with_etcd_as_the_arbiter_keep_the_invariants() -> None:
    _run_all(ETCD_SEEDS, "etcd")


@pytest.mark.long
@pytest.mark.timeout(900)
def test_more_seeded_runs_with_etcd_keep_the_invariants() -> None:
    _run_all(MORE_ETCD_SEEDS, "etcd")


@pytest.mark.parametrize("seed", sorted(FIXED))
def test_seeds_that_found_fixed_bugs(seed: int) -> None:
    result = run_seed(seed)
    assert result.ok, f"{FIXED[seed]}: {result.problem}\n{result.trace}"


@pytest.mark.parametrize("seed", sorted(FIXED_ETCD))
def test_etcd_seeds_that_found_fixed_bugs(seed: int) -> None:
    result = run_seed(seed, arbiter="etcd")
    assert result.ok, f"{FIXED_ETCD[seed]}: {result.problem}\n{result.trace}"
