"""Failover URLs and options: the Artemis names in the URL, keywords winning, clear errors."""

from __future__ import annotations

import pytest

from pairmq.client import OPTIONS, ConfigurationError, parse_options


def test_failover_url_with_artemis_parameters():
    o = parse_options("failover:(stomp://h1:61613,stomp://h2:61614)?reconnectAttempts=-1"
                      "&retryInterval=100&retryIntervalMultiplier=1.5&maxRetryInterval=1000"
                      "&initialConnectAttempts=3&clientFailureCheckPeriod=4000"
                      "&connectionTTL=20000&callTimeout=5000&clientID=c1", {})
    assert o.servers == (("h1", 61613), ("h2", 61614))
    assert (o.reconnect_attempts, o.retry_interval, o.retry_interval_multiplier,
            o.max_retry_interval, o.initial_connect_attempts) == (-1, 100, 1.5, 1000, 3)
    assert (o.client_failure_check_period, o.connection_ttl, o.call_timeout) == \
        (4000, 20000, 5000)
    assert o.client_id == "c1"
    assert o.heart_beat == (2000, 2000)


def test_keywords_win_over_the_url_and_plain_address_lists_work():
    o = parse_options("failover:(tcp://h1:1)?retryInterval=100", {"retry_interval": 7})
    assert o.retry_interval == 7 and o.servers == (("h1", 1),)
    assert parse_options("h1:1,h2:2", {}).servers == (("h1", 1), ("h2", 2))
    assert parse_options(["stomp://h1:1"], {"login": "u", "passcode": "p"}).login == "u"


def test_defaults_come_from_the_one_table():
    o = parse_options("h:1", {})
    for option in OPTIONS:
        assert getattr(o, option.name) == option.default


@pytest.mark.parametrize(("url", "keywords", "message"), [
    ("failover:(h:1)?retryIntervall=5", {}, "unknown URL parameter 'retryIntervall'"),
    ("failover:(h:1)?retryInterval=soon", {}, "URL parameter retryInterval must be int"),
    ("h:1", {"retry_intervall": 5}, "unknown option 'retry_intervall'"),
    ("h:1", {"reconnect_attempts": -2}, "option reconnect_attempts must be >= -1"),
    ("h:1", {"outbox_full_policy": "wait"}, "must be one of fail, block"),
    ("failover:()", {}, "no server address"),
    ("h:notaport", {}, "not a server address"),
])
def test_a_bad_option_is_named(url, keywords, message):
    with pytest.raises(ConfigurationError, match=message):
        parse_options(url, keywords)


def test_every_option_is_in_the_documentation_with_its_default():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "clients.md").read_text()
    for option in OPTIONS:
        default = "none" if option.default is None else option.default
        row = f"| `{option.name}` | `{option.url_name}` | {default} |"
        assert row in text, f"docs/clients.md lacks the row of {option.name}: {row}"
