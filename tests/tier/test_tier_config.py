"""The storage node's `storage.tier.*` keys: off unless the URL is set, checked values, and the
one line that says how to install pyarrow when the URL is set without it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from waltz_engine.common.config import Config, ConfigError
from waltz_engine.common.extras import MissingExtraError
from waltz_engine.storage.node.config import StorageConfig
from waltz_engine.storage.tier.settings import DEFAULT_TIER_CACHE_BYTES, TierSettings

BASE = {
    "storage.port": 1,
    "storage.admin.port": 2,
    "storage.directory": "data",
    "zookeeper.connectString": "127.0.0.1:2181",
    "zookeeper.sessionTimeout": 30_000,
    "cluster.root": "/waltz",
}


def _load(**keys: Any) -> StorageConfig:
    return StorageConfig.from_config(Config({**BASE, **keys}, "storage.yml"))


def test_off_by_default_and_read_when_the_url_is_set() -> None:
    assert _load().tier is None
    assert _load(**{"storage.tier.local.bytes": 5}).tier is None
    tier = _load(**{"storage.tier.url": "s3://b/p", "storage.tier.local.bytes": 60_000}).tier
    assert tier == TierSettings("s3://b/p", local_bytes=60_000)
    assert tier.cache_bytes == DEFAULT_TIER_CACHE_BYTES


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("storage.tier.url", " ", "must not be empty"),
        ("storage.tier.url", "bogus://b/p", "unknown URL scheme 'bogus://'"),
        ("storage.tier.local.bytes", -1, "must not be negative"),
        ("storage.tier.bytes.per.second", 0, "storage.tier.bytes.per.second"),
        ("storage.tier.cache.bytes", 0, "storage.tier.cache.bytes"),
    ],
)
def test_bad_values_are_one_line_errors(key: str, value: Any, says: str) -> None:
    keys = {"storage.tier.url": "file:///tier", key: value}
    with pytest.raises(ConfigError, match=says) as raised:
        _load(**keys)
    assert "\n" not in str(raised.value)


def test_a_node_with_a_url_that_can_never_work_stops_at_start_with_one_line(tmp_path: Path) -> None:
    """`bogus://` is refused before the node starts (it would otherwise retry forever)."""
    config = tmp_path / "storage.yml"
    keys = {**BASE, "storage.directory": str(tmp_path / "data"), "storage.tier.url": "bogus://b/p"}
    config.write_text("".join(f"{key}: {value}\n" for key, value in keys.items()))
    done = subprocess.run(
        [sys.executable, "-m", "waltz_cli", "storage", "start", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and "unknown URL scheme 'bogus://'" in done.stderr, done.stderr


def test_the_url_without_pyarrow_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else find_spec(name, *a)
    )
    with pytest.raises(MissingExtraError) as raised:
        _load(**{"storage.tier.url": "file:///tier"})
    message = str(raised.value)
    assert "storage.tier.url" in message and "pip install 'waltz-py[backup]'" in message
    assert "\n" not in message
