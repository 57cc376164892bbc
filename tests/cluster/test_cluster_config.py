"""[cluster] keys: the TOML file and the flags, and what a server refuses to start with."""

from __future__ import annotations

from pathlib import Path

import pytest

from pairmq.server.config import ConfigError, load_config
from tests.ha.test_config import run_server

PAIR = ('[ha]\npolicy = "replication"\nlisten = "127.0.0.1:7001"\npeer = "127.0.0.1:7002"\n'
        'secret = "s"\n')


def _load(tmp_path: Path, text: str):
    path = tmp_path / "server.toml"
    path.write_text(text)
    return load_config(path)


def test_cluster_keys_from_toml(tmp_path: Path) -> None:
    config = _load(tmp_path, '[cluster]\nname = "prod"\nmember = "east"\n'
                   'members = ["failover:(stomp://a:1,stomp://b:2)", "stomp://c:3"]\n'
                   'message_load_balancing = "strict"\nredistribution_delay_ms = -1\n'
                   'user = "bridge"\npassword = "pw"\n')
    assert config.cluster_name == "prod" and config.member_name == "east"
    assert config.cluster_members == ("failover:(stomp://a:1,stomp://b:2)", "stomp://c:3")
    assert config.message_load_balancing == "strict"
    assert config.redistribution_delay_ms == -1
    assert (config.cluster_user, config.cluster_password) == ("bridge", "pw")


def test_cluster_keys_from_flags() -> None:
    config = load_config(None, {"cluster_name": "prod",
                                "cluster_members": "stomp://a:1 stomp://b:2"})
    assert config.cluster_members == ("stomp://a:1", "stomp://b:2")
    assert config.member_name == "standalone"  # [server] name, standalone
    assert config.message_load_balancing == "on_demand"


def test_member_name_of_a_pair_is_its_group(tmp_path: Path) -> None:
    config = _load(tmp_path, PAIR + 'group = "east"\n[cluster]\nname = "prod"\n'
                   'members = ["stomp://c:3"]\n')
    assert config.member_name == "east"


@pytest.mark.parametrize(("text", "message"), [
    ('[cluster]\nmembers = ["stomp://a:1"]\n', "name is required"),
    ('[cluster]\nname = "prod"\n', "members is required"),
    ('[cluster]\nname = "prod"\nmembers = ["a:1"]\n', 'must list members as "failover:('),
    ('[cluster]\nname = "prod"\nmembers = ["failover:(stomp://a:1"]\n',
     'must list members as "failover:('),
    ('[cluster]\nname = "prod"\nmembers = "stomp://a:1"\n', "must be a list of strings"),
    ('[cluster]\nname = "prod"\nmembers = ["stomp://a:1", "stomp://a:1"]\n',
     "lists one URL twice"),
    ('[cluster]\nname = "a b"\nmembers = ["stomp://a:1"]\n', "must be 1 to 64 letters"),
    ('[cluster]\nname = "prod"\nmembers = ["stomp://a:1"]\n'
     'message_load_balancing = "round_robin"\n', "must be one of off, strict, on_demand"),
    ('[cluster]\nname = "prod"\nmembers = ["stomp://a:1"]\nredistribution_delay_ms = -2\n',
     "must be an integer >= -1"),
    ('[cluster]\nname = "prod"\nmembers = ["stomp://a:1"]\npassword = "p"\n',
     "password is set without user"),
    (PAIR + '[cluster]\nname = "prod"\nmembers = ["stomp://a:1"]\n',
     "member (or [ha] group) is required on a pair"),
])
def test_bad_cluster_settings_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, text)
    assert message in str(refused.value)
    assert "[cluster]" in str(refused.value)


def test_server_refuses_to_start_with_a_bad_member_url(tmp_path: Path) -> None:
    result = run_server(tmp_path, "--cluster-name", "prod", "--cluster-members", "a:1")
    assert result.returncode != 0
    assert "--cluster-members" in result.stderr and "must list members" in result.stderr


def test_scale_down_keys_and_scale_down_without_a_cluster_refused(tmp_path: Path) -> None:
    config = _load(tmp_path, '[ha]\nscale_down = true\nscale_down_group = "east"\n'
                   '[cluster]\nname = "prod"\nmembers = ["stomp://c:3"]\n')
    assert config.scale_down and config.scale_down_group == "east"
    assert not load_config(None, {"cluster_name": "prod",
                                  "cluster_members": "stomp://a:1"}).scale_down
    with pytest.raises(ConfigError, match=r"\[ha\] scale_down needs a \[cluster\]"):
        _load(tmp_path, "[ha]\nscale_down = true\n")


COLOCATED = ('[ha]\npolicy = "colocated"\nlisten = "127.0.0.1:7000"\nsecret = "s"\n'
             'group = "m0"\nwitness = "etcd://127.0.0.1:2379"\n')
COLOCATED_CLUSTER = '[cluster]\nname = "prod"\nmembers = ["stomp://c:3"]\n'


def test_colocated_keys_with_artemis_meanings(tmp_path: Path) -> None:
    config = _load(tmp_path, COLOCATED + 'request_backup = true\nmax_backups = 2\n'
                   'backup_request_retries = 5\nbackup_request_retry_interval_ms = 1500\n'
                   'backup_port_offset = 200\n' + COLOCATED_CLUSTER)
    assert (config.policy, config.request_backup, config.max_backups,
            config.backup_request_retries, config.backup_request_retry_interval_ms,
            config.backup_port_offset) == ("colocated", True, 2, 5, 1500, 200)
    assert config.peer == ""  # the backup is found in the cluster, and dials this live
    defaults = _load(tmp_path, COLOCATED + COLOCATED_CLUSTER)
    assert (defaults.request_backup, defaults.max_backups, defaults.backup_request_retries,
            defaults.backup_request_retry_interval_ms, defaults.backup_port_offset) == \
        (False, 1, -1, 5000, 100)  # Artemis' defaults


@pytest.mark.parametrize(("extra", "cluster", "message"), [
    ("", "", r'policy = "colocated" needs a \[cluster\]'),
    ('peer = "127.0.0.1:7001"\n', COLOCATED_CLUSTER, r"peer is not used with policy"),
    ('role = "backup"\n', COLOCATED_CLUSTER, r"role must be primary"),
    ("backup_port_offset = 60000\n", COLOCATED_CLUSTER, r"past 65535"),
    ("max_backups = -1\n", COLOCATED_CLUSTER, r"max_backups must be an integer >= 0"),
])
def test_bad_colocated_settings_are_refused(tmp_path: Path, extra: str, cluster: str,
                                            message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, COLOCATED + extra + cluster)


def test_colocated_lives_need_an_etcd_arbiter_not_a_pairmq_witness(tmp_path: Path) -> None:
    text = COLOCATED.replace("etcd://127.0.0.1:2379", "127.0.0.1:7100")
    with pytest.raises(ConfigError, match=r"a `pairmq witness` arbitrates one pair"):
        _load(tmp_path, text + COLOCATED_CLUSTER)
