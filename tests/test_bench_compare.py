"""benchmarks/compare.py, the guard for the per-message path: the parts that decide what is
compared and how it is reported. The alternating runs themselves are a benchmark
(`make bench-compare`), not a test."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from benchmarks import compare
from benchmarks.compare import WORK, Build, Run, Scenario

ROOT = Path(__file__).resolve().parent.parent


def test_the_reference_is_taken_from_git_and_imported_from_there(tmp_path: Path) -> None:
    src = compare.reference_source("HEAD", tmp_path)
    assert (src / "pairmq" / "__init__.py").is_file()
    committed = subprocess.run(["git", "-C", str(ROOT), "show", "HEAD:src/pairmq/__init__.py"],
                               capture_output=True, check=True).stdout
    assert (src / "pairmq" / "__init__.py").read_bytes() == committed
    compare.check_imports(Build("HEAD", src))  # raises unless pairmq comes from `src`


def test_a_build_that_would_import_another_copy_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "src"
    empty.mkdir()  # no pairmq here: the installed one would be imported instead
    with pytest.raises(SystemExit, match="pairmq imports from"):
        compare.check_imports(Build("nothing", empty))


def test_an_unknown_ref_says_so(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no-such-ref-here"):
        compare.reference_source("no-such-ref-here", tmp_path)


def test_the_shared_bench_load_needs_its_generator(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "stompbench.py"
    with pytest.raises(SystemExit):
        compare.parse_args(["--ref", "main", "--load", "stompbench", "--stompbench", str(missing)])
    assert f"no {missing}" in capsys.readouterr().err
    args = compare.parse_args(["--ref", "main"])
    assert args.load == "pairmq"


def test_a_reference_directory_is_named_after_it_and_must_hold_pairmq(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build = tmp_path / "compiled"
    (build / "pairmq").mkdir(parents=True)
    args = compare.parse_args(["--ref-src", str(build)])
    assert (args.ref, args.ref_src) == ("compiled", build)
    with pytest.raises(SystemExit):
        compare.parse_args(["--ref-src", str(tmp_path)])
    assert f"no pairmq package in {tmp_path}" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one reference, not two
        compare.parse_args(["--ref", "main", "--ref-src", str(build)])


def test_unknown_scenarios_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        compare.parse_args(["--ref", "main", "--scenarios", "durable,fastest"])
    assert "fastest" in capsys.readouterr().err


def test_ratios_are_the_median_of_each_rounds_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = Scenario("durable", 1, 1, True)
    runs = []
    # round by round, work over ref: CPU 1.10, 0.90, 1.20 (median 1.10); rate 0.5, 1, 2
    for rnd, (ref_cpu, work_cpu, ref_rate, work_rate) in enumerate(
            [(10.0, 11.0, 100.0, 50.0), (20.0, 18.0, 100.0, 100.0), (10.0, 12.0, 50.0, 100.0)]):
        runs.append(Run("abc123", "durable", rnd, ref_rate, ref_cpu))
        runs.append(Run(WORK, "durable", rnd, work_rate, work_cpu))
    ratios = compare.report(runs, "abc123", [scenario])
    assert ratios == {"durable": pytest.approx(1.10)}
    out = capsys.readouterr().out
    assert "1.000" in out  # the rate ratio's median
    assert "1.100 0.900 1.200" in out  # every round's CPU ratio, shown
    assert "work costlier in 2 of 3 rounds" in out
    assert "between 0.900 and 1.200" in out  # under 4 rounds: all of them


def test_the_spread_is_the_middle_half_of_the_rounds() -> None:
    assert compare.spread([1.0, 1.1]) == (1.0, 1.1)
    low, high = compare.spread([0.9, 1.0, 1.02, 1.04, 1.06, 1.3])
    assert 0.9 < low < 1.02 and 1.04 < high < 1.3


def test_fail_above_exits_non_zero_when_a_ratio_is_over(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    def fake_round(build: Build, scenarios: list[Scenario], messages: int, rnd: int,
                   scratch: Path, stompbench: Path | None = None) -> list[Run]:
        cpu = 12.0 if build.name == WORK else 10.0  # the working tree costs 1.2x
        return [Run(build.name, s.name, rnd, 1000.0, cpu) for s in scenarios]

    monkeypatch.setattr(compare, "one_round", fake_round)
    args = ["--ref", "HEAD", "--rounds", "2", "--scenarios", "durable"]
    assert compare.main([*args, "--fail-above", "1.25"]) == 0
    assert compare.main([*args, "--fail-above", "1.05"]) == 1



def test_a_servers_cpu_is_read_finer_than_the_clock_tick() -> None:
    """compare.py and pair_compare.py read a process's run time to the microsecond: 3 ms of
    CPU (under a 10 ms tick, which user and system time come in) show, and no more than
    the process spent."""
    from benchmarks.loadgen import run_time_seconds

    pid = os.getpid()
    before, cpu_before = run_time_seconds(pid), time.process_time()
    if before is None:
        pytest.skip("this kernel has no /proc/PID/task/*/sched")
    while time.process_time() - cpu_before < 0.003:
        pass
    after, cpu_after = run_time_seconds(pid), time.process_time()
    assert after is not None
    assert 0.002 <= after - before <= (cpu_after - cpu_before) + 0.002
