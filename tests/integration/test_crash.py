"""The crash test: a real server SIGKILLed at random moments while a producer sends.

The campaign lives in benchmarks/crash_campaign.py (the long standalone version:
`--kills N --seed S`); this runs a short one (3 kills, about 12 s) and checks each
outcome separately. A producer sends persistent messages with receipts and dup-ids;
the server is killed with SIGKILL at seeded random moments and restarted on the same
data directory and port each time; the producer reconnects and resends everything it
has not seen receipted, with the same dup-id. At the end consumers drain the queues:
every receipted message is consumed, and exactly once. The seed is fixed so a failure
can be replayed; PAIRMQ_CRASH_SEED and PAIRMQ_CRASH_KILLS change it.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.support.benchmarks import benchmark

crash = benchmark("crash_campaign")

SEED = int(os.environ.get("PAIRMQ_CRASH_SEED", "20240612"))
KILLS = int(os.environ.get("PAIRMQ_CRASH_KILLS", "3"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """One campaign; the tests below each check one outcome of it."""
    # A small destination limit: the main queue pages, and restarts read the runs of its
    # sealed segments through their summaries (store/summary.py) with SENDs in flight.
    settings = crash.Settings(kills=KILLS, seed=SEED, min_interval=0.3, max_interval=1.5,
                              round_kills=0, rate=3000.0,
                              extra_flags=("--max-size-bytes", "65536"))
    return crash.run_campaign(settings, tmp_path_factory.mktemp("crash"))


def test_the_server_was_killed_and_came_back_every_time(campaign):
    assert campaign.errors == []
    assert campaign.kills == KILLS
    assert campaign.restarts == KILLS + 2  # and once before each drain


def test_the_kills_hit_a_server_at_work(campaign):
    assert campaign.kills_with_sends_outstanding >= KILLS // 2, campaign
    assert campaign.summarised_restarts >= KILLS // 2, campaign
    assert campaign.receipted >= 1000, campaign
    assert campaign.resent > 0, "some SENDs were cut off by a kill and sent again"


def test_the_producer_got_a_receipt_for_every_message_in_the_end(campaign):
    assert campaign.receipted == campaign.messages


def test_every_receipted_message_is_consumed(campaign):
    assert campaign.main_lost == 0, campaign
    assert campaign.churn_lost == 0, campaign
    assert campaign.lost == 0


def test_no_message_is_consumed_twice_thanks_to_dup_ids(campaign):
    assert campaign.duplicates == 0, campaign
    assert campaign.unexpected == 0, campaign
    assert campaign.consumed == campaign.receipted - campaign.churn_receipted


def test_the_campaign_summary_is_one_json_line(tmp_path, capsys):
    """The standalone command's contract, on a zero-kill run: one JSON line, exit 0."""
    import json

    code = crash.main(["--kills", "0", "--seed", "1", "--quiet", "--max-interval", "0.3",
                       "--workdir", str(tmp_path)])
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    summary = json.loads(out[0])
    for key in ("kills", "sent", "receipted", "consumed", "duplicates", "lost"):
        assert key in summary
    assert code == 0 and summary["ok"] is True and summary["lost"] == 0


def test_the_campaign_leaves_the_test_process_sigterm_handler_as_it_was(tmp_path, capsys):
    """main() run inside the test process installs no SIGTERM handler of its own: one left
    behind turned a SIGTERM to the suite (a CI time-out) into SystemExit in whichever test
    ran next, and the suite went on."""
    before = signal.getsignal(signal.SIGTERM)
    code = crash.main(["--kills", "0", "--seed", "2", "--quiet", "--max-interval", "0.3",
                       "--workdir", str(tmp_path)])
    capsys.readouterr()
    assert code == 0
    assert signal.getsignal(signal.SIGTERM) is before
