"""Thousands of random and mutated frames against one running server.

The fuzzing itself lives in benchmarks/fuzz_campaign.py (the long standalone
campaign); this runs a short campaign of it (about a quarter minute) and checks
each outcome separately. The seed is fixed so a failure can be replayed; set
PAIRMQ_FUZZ_SEED to try another one, PAIRMQ_FUZZ_FRAMES for a longer run.
"""

from __future__ import annotations

import os

import pytest

from tests.serverproc import start_server
from tests.support.benchmarks import benchmark

fuzz = benchmark("fuzz_campaign")

SEED = int(os.environ.get("PAIRMQ_FUZZ_SEED", "20240611"))
FRAMES = int(os.environ.get("PAIRMQ_FUZZ_FRAMES", "40000"))
MAX_SECONDS = float(os.environ.get("PAIRMQ_FUZZ_SECONDS", "15"))  # whichever comes first
MIN_FRAMES = 2000  # "thousands": fewer within MAX_SECONDS means the server is far too slow
LIMITS = fuzz.Limits(max_frame_bytes=65536, max_headers=50, max_header_bytes=1024)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """One server, one campaign; the tests below each check one outcome of it."""
    workdir = tmp_path_factory.mktemp("fuzz")
    srv = start_server(workdir, *LIMITS.flags(), "--user", "admin:secret", name="fuzz")
    try:
        result = fuzz.run_campaign(
            srv.address,
            pid=srv.proc.pid,
            frames=FRAMES,
            seed=SEED,
            limits=LIMITS,
            workers=4,
            max_seconds=MAX_SECONDS,
            alive=srv.alive,
            dump_dir=workdir,
        )
        result.server_alive = result.server_alive and srv.alive()
        yield srv, result
    finally:
        srv.stop()


def _context(srv, result) -> str:
    return (
        f"\nseed {SEED}; summary {result.summary()}\n"
        f"findings (first 5): {result.findings[:5]}\n"
        f"recent cases: {result.dump}\nserver log tail:\n{srv.logs()[-2000:]}"
    )


def test_campaign_sent_thousands_of_frames(campaign):
    srv, result = campaign
    assert result.frames_sent >= MIN_FRAMES, _context(srv, result)
    kinds = result.summary()["cases_by_kind"]
    assert set(kinds) == {k for k, _ in fuzz.Generator.KINDS}, kinds


def test_campaign_exercised_both_error_and_normal_paths(campaign):
    srv, result = campaign
    s = result.stats
    assert s["recv_ERROR"] > 100, _context(srv, result)
    assert s["recv_CONNECTED"] > 100, _context(srv, result)
    assert s["recv_RECEIPT"] > 10, _context(srv, result)


def test_server_process_alive_after_campaign(campaign):
    srv, result = campaign
    assert result.server_alive, _context(srv, result)
    assert srv.alive(), _context(srv, result)


def test_well_behaved_client_kept_working_during_fuzzing(campaign):
    srv, result = campaign
    assert not result.roundtrip_failures, _context(srv, result)
    assert result.roundtrips_ok >= 20, _context(srv, result)


def test_new_client_can_connect_send_and_receive_after_campaign(campaign):
    srv, result = campaign
    assert result.post_check == "ok", _context(srv, result)
    fuzz.check_good_client(srv.address, roundtrips=5)


def test_server_accepted_every_connection(campaign):
    srv, result = campaign
    assert result.stats["connect_failures"] == 0, _context(srv, result)


def test_tcp_connections_back_to_baseline(campaign):
    srv, result = campaign
    assert result.conns_before >= 0
    assert result.conns_after == result.conns_before, _context(srv, result)


def test_no_socket_or_fd_leak(campaign):
    srv, result = campaign
    assert result.socket_fds_after <= result.socket_fds_before, _context(srv, result)
    assert result.fds_after <= result.fds_before + fuzz.FD_SLACK, _context(srv, result)


def test_server_output_always_valid_frames(campaign):
    srv, result = campaign
    assert result.stats["unparsable_output"] == 0, _context(srv, result)


def test_every_error_names_a_problem(campaign):
    srv, result = campaign
    assert result.stats["error_without_message"] == 0, _context(srv, result)


def test_every_error_is_followed_by_a_close(campaign):
    srv, result = campaign
    assert result.stats["frame_after_error"] == 0, _context(srv, result)
    assert result.stats["error_not_closed"] == 0, _context(srv, result)


def test_server_closes_when_the_client_is_gone(campaign):
    srv, result = campaign
    assert result.stats["no_close_after_eof"] == 0, _context(srv, result)


def test_server_never_stopped_reading_a_fuzzing_client(campaign):
    srv, result = campaign
    assert result.stats["send_stalled"] == 0, _context(srv, result)
