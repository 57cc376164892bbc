"""The database journal's pure parts: schema names, versions, a URL's password kept out of
logs, and the configuration's refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from pairmq.server.config import ConfigError, load_config
from pairmq.store.database.schema import (
    SCHEMA_VERSION,
    redacted,
    schema_name,
    version_problem,
)

URL = "postgresql://pairmq:s3cret@db:5432/messaging"


def test_schema_names_are_plain_identifiers_per_pair() -> None:
    assert schema_name("orders") == "pairmq_orders"
    assert schema_name("Pair-1.eu") == "pairmq_pair_1_eu"
    assert len(schema_name("x" * 100)) == 63


def test_a_newer_or_damaged_layout_is_refused_by_name() -> None:
    assert version_problem([], "pairmq_a") is None
    assert version_problem([SCHEMA_VERSION], "pairmq_a") is None
    problem = version_problem([SCHEMA_VERSION + 1], "pairmq_a")
    assert problem is not None and "newer than this pairmq's" in problem
    assert "damaged" in (version_problem([1, 1], "pairmq_a") or "")


def test_the_password_never_appears_in_what_is_logged() -> None:
    assert redacted(URL) == "postgresql://pairmq:***@db:5432/messaging"
    assert redacted("postgresql://db/messaging") == "postgresql://db/messaging"


def load(tmp_path: Path, text: str):
    path = tmp_path / "pairmq.toml"
    path.write_text(text)
    return load_config(path)


@pytest.mark.parametrize(("text", "says"), [
    ('[store]\nurl = "mysql://u:p@h/db"\n', 'must be "postgresql://'),
    ('[store]\npassword_file = "/nonexistent"\n', "password_file is only used with url"),
    (f'[store]\nurl = "{URL}"\npassword_file = "/nonexistent"\n', "no such file"),
    (f'[store]\nurl = "{URL}"\n[ha]\npolicy = "replication"\nlisten = "127.0.0.1:1"\n'
     'peer = "127.0.0.1:2"\nsecret = "s"\nwitness = "127.0.0.1:3"\n',
     "a replicated pair keeps a journal on each server"),
    (f'[store]\nurl = "{URL}"\n[ha]\npolicy = "shared-store"\nlisten = "127.0.0.1:1"\n'
     'peer = "127.0.0.1:2"\nsecret = "s"\nshared_dir = "/tmp"\n',
     "shared_dir is not used with [store] url"),
])
def test_the_configuration_refuses_what_cannot_work(tmp_path: Path, text: str,
                                                    says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load(tmp_path, text)
    assert says in str(refused.value)
    assert "s3cret" not in str(refused.value)


def test_a_shared_store_pair_on_a_database_needs_no_shared_dir(tmp_path: Path) -> None:
    config = load(tmp_path, f'[store]\nurl = "{URL}"\n[ha]\npolicy = "shared-store"\n'
                  'listen = "127.0.0.1:1"\npeer = "127.0.0.1:2"\nsecret = "s"\n'
                  'group = "orders"\n')
    assert config.url == URL and not config.shared_dir
