"""Pure unit tests: YAML config loading (§0.3), ZooKeeper settings, partition range text."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from waltz_engine.common.config import Config, ConfigError
from waltz_engine.common.errors import WaltzError
from waltz_engine.ops.tool_config import load_settings
from waltz_engine.zk.connection import (
    DEFAULT_CONNECT_TIMEOUT_MS,
    DEFAULT_SESSION_TIMEOUT_MS,
    KNOWN_KEYS,
    ZooKeeperSettings,
)
from waltz_engine.zk.partition_ranges import (
    MAX_PARTITIONS_PER_REQUEST,
    PartitionRangeError,
    format_partition_ranges,
    parse_partition_ranges,
)

EQUIVALENT_YAML = [
    "zookeeper.connectString: h:1\nzookeeper.sessionTimeout: 5000\ncluster.root: /w\n",
    "zookeeper:\n  connectString: h:1\n  sessionTimeout: 5000\ncluster:\n  root: /w\n",
    "zookeeper:\n  connectString: h:1\n  sessionTimeout: '5000'\ncluster.root: /w\n",
    "zookeeper: {connectString: h:1}\nzookeeper.sessionTimeout: 5000\ncluster: {root: /w}\n",
]


@pytest.mark.parametrize("text", EQUIVALENT_YAML)
def test_dotted_and_nested_keys_are_equivalent(text: str) -> None:
    config = Config.from_yaml(text, "tools.yml")
    assert config.keys() == ["cluster.root", "zookeeper.connectString", "zookeeper.sessionTimeout"]
    assert config.require_int("zookeeper.sessionTimeout") == 5000
    expected = ZooKeeperSettings("h:1", "/w", 5000, DEFAULT_CONNECT_TIMEOUT_MS)
    assert ZooKeeperSettings.from_config(config) == expected


def test_missing_required_key_names_key_and_file(tmp_path: Path) -> None:
    path = tmp_path / "server.yml"
    path.write_text("server:\n  port: 55180\n")
    config = Config.load(path)
    with pytest.raises(ConfigError) as raised:
        config.require_str("zookeeper.connectString")
    assert str(raised.value) == f"{path}: missing required key 'zookeeper.connectString'"
    assert config.require_int("server.port") == 55180


def test_typed_getters_parse_strings_and_refuse_bad_values() -> None:
    key = uuid.uuid4()
    config = Config.from_yaml(
        f"a: 'true'\nb: FALSE\nc: ' 12 '\nd: {key}\ne: x\nf: 3000000000\ng: true\nh: [1]\nempty:\n"
    )
    assert config.require_bool("a") is True and config.get_bool("b", True) is False
    assert config.require_int("c") == 12
    assert config.require_uuid("d") == key
    assert config.require_long("f") == 3_000_000_000
    assert config.get_int("missing", 7) == 7 and config.get_str("missing", "x") == "x"
    assert config.optional_str("empty") is None and "empty" not in config
    for getter, bad_key, message in [
        (config.require_int, "e", "32-bit integer"),
        (config.require_int, "f", "out of range"),
        (config.require_int, "g", "boolean"),
        (config.require_bool, "e", "true or false"),
        (config.require_uuid, "e", "UUID"),
        (config.require_str, "h", "a string"),
    ]:
        with pytest.raises(ConfigError, match=message):
            getter(bad_key)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [", "not valid YAML"),
        ("- a\n- b\n", "mapping"),
        ("a.b: 1\na:\n  b: 2\n", "'a.b' is given more than once"),
    ],
)
def test_bad_config_files_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        Config.from_yaml(text, "bad.yml")
    assert "\n" not in str(raised.value)


def test_missing_config_file_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        Config.load(tmp_path / "nope.yml")
    (tmp_path / "empty.yml").write_text("")
    assert Config.load(tmp_path / "empty.yml").keys() == []


def test_unknown_keys_are_reported_through_the_hook() -> None:
    config = Config.from_yaml("zookeeper.connectString: h:1\nzookeeper.conectTimeout: 5\nssl.x: JKS\n")
    warnings: list[str] = []
    unknown = config.warn_unknown_keys(KNOWN_KEYS, warnings.append, known_prefixes=("ssl.",))
    assert unknown == ["zookeeper.conectTimeout"]
    assert warnings == [
        "<config>: unknown config key 'zookeeper.conectTimeout' "
        "(ignored; did you mean 'zookeeper.connectTimeout'?)"
    ]


def test_flags_override_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "tools.yml"
    path.write_text("zookeeper.connectString: a:1\ncluster.root: /from-file/\n")
    assert load_settings(path, None, None) == ZooKeeperSettings(
        "a:1", "/from-file", DEFAULT_SESSION_TIMEOUT_MS, DEFAULT_CONNECT_TIMEOUT_MS
    )
    assert load_settings(path, "b:2,c:3", "/flag", 500) == ZooKeeperSettings(
        "b:2,c:3", "/flag", DEFAULT_SESSION_TIMEOUT_MS, 500
    )


@pytest.mark.parametrize(
    ("zookeeper", "root", "message"),
    [
        (None, "/r", "zookeeper.connectString"),
        ("h:1", None, "cluster.root"),
        ("h", "/r", "HOST:PORT"),
        ("h:99999", "/r", "HOST:PORT"),
        ("h:1", "r", "absolute"),
    ],
)
def test_incomplete_or_bad_settings_are_refused(
    zookeeper: str | None, root: str | None, message: str
) -> None:
    with pytest.raises(WaltzError, match=message):
        ZooKeeperSettings.resolve(zookeeper=zookeeper, cluster_root=root)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0-6,7,10-16", [0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16]),
        ("3", [3]),
        ("0-3,2,1", [0, 1, 2, 3]),
        (" 1 - 2 , 5 ", [1, 2, 5]),
    ],
)
def test_partition_ranges_parse_sorted_and_deduplicated(text: str, expected: list[int]) -> None:
    assert parse_partition_ranges(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("a", "not a partition id"),
        ("1,,2", "not a partition id"),
        ("-1", "not a partition id"),
        ("1-", "not a partition id"),
        ("3-1", "goes backwards"),
        ("0-99999999999", "too large"),
        (f"0-{MAX_PARTITIONS_PER_REQUEST}", "more than"),
    ],
)
def test_bad_partition_ranges_are_refused(text: str, message: str) -> None:
    with pytest.raises(PartitionRangeError, match=message):
        parse_partition_ranges(text)


def test_partition_ranges_format_compactly() -> None:
    assert format_partition_ranges([7, 0, 1, 2, 3, 10, 12, 11]) == "0-3,7,10-12"
    assert format_partition_ranges([]) == ""
    parsed = parse_partition_ranges("0-6,7,10-16")
    assert parse_partition_ranges(format_partition_ranges(parsed)) == parsed
