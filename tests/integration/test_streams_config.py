"""`[streams]` in the configuration (docs/configuration.md, "Streams"): defaults, one
stream's retention, and refusals that name the table and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pairmq.core.settings import Retention
from pairmq.server.config import ConfigError, load_config


def config(tmp_path: Path, text: str):
    path = tmp_path / "server.toml"
    path.write_text(text)
    return load_config(path)


def test_defaults_and_one_streams_override(tmp_path):
    settings = config(tmp_path, """
[streams]
max_age_ms = 60000
[streams.retention.orders]
max_bytes = 5000
group = "spark"
""").core_settings()
    assert settings.retention_for("other") == Retention(1024 ** 3, 60000)
    assert settings.retention_for("orders") == Retention(5000, 60000, "spark")
    inline = config(tmp_path, '[streams]\nretention = {logs = {max_age_ms = 10}}\n')
    assert inline.core_settings().retention_for("logs") == Retention(1024 ** 3, 10)
    assert load_config(None, {"max_bytes": 7}).core_settings().retention_for("x").max_bytes == 7


@pytest.mark.parametrize(("text", "named"), [
    ("[streams]\nmax_bytes = -1\n", "[streams] max_bytes"),
    ("[streams.retention.orders]\nmax_byte = 1\n",
     "[streams.retention.orders] has unknown key 'max_byte'"),
    ("[streams.retention.orders]\nmax_age_ms = \"1h\"\n", "[streams.retention.orders] max_age_ms"),
    ("[streams.retention.orders]\ngroup = \"\"\n", "[streams.retention.orders] group"),
    ("[streams]\nretention = {orders = {}}\n", "[streams.retention.orders] must be a table"),
])
def test_bad_retention_is_refused_naming_stream_and_key(tmp_path, text, named):
    with pytest.raises(ConfigError) as refused:
        config(tmp_path, text)
    assert named in str(refused.value)
