"""A client configuration in one call: a YAML file, zookeeper/cluster_root, or the nearest dev
cluster (``.waltz-dev/client.yml`` here or in a directory above, as the CLI finds it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from waltz_engine.client import WaltzClientConfig
from waltz_engine.client.config import client_config
from waltz_engine.common.config import ConfigError, dev_client_config_path, find_dev_client_config

DEV_YAML = (
    "zookeeper.connectString: 127.0.0.1:2181\ncluster.root: /dev-root\nclient.maxConcurrentTransactions: 7\n"
)


def dev_cluster_at(directory: Path) -> Path:
    config = directory / dev_client_config_path()
    config.parent.mkdir(parents=True)
    config.write_text(DEV_YAML, encoding="utf-8")
    return config


def test_the_dev_cluster_is_found_from_any_directory_below_it(tmp_path: Path) -> None:
    config = dev_cluster_at(tmp_path)
    below = tmp_path / "examples" / "deeper"
    below.mkdir(parents=True)
    assert find_dev_client_config(below) == config
    assert find_dev_client_config(tmp_path) == config


def test_the_nearest_dev_cluster_wins(tmp_path: Path) -> None:
    dev_cluster_at(tmp_path)
    inner = dev_cluster_at(tmp_path / "inner")
    assert find_dev_client_config(tmp_path / "inner") == inner


def test_no_dev_cluster_found(tmp_path: Path) -> None:
    if find_dev_client_config(tmp_path.parent) is not None:
        pytest.skip("a dev cluster runs above the temporary directory")
    assert find_dev_client_config(tmp_path) is None


def test_load_with_no_arguments_uses_the_dev_cluster_above(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev_cluster_at(tmp_path)
    below = tmp_path / "src"
    below.mkdir()
    monkeypatch.chdir(below)
    config = WaltzClientConfig.load()
    assert config.zookeeper is not None and config.zookeeper.cluster_root == "/dev-root"
    assert config.max_concurrent_transactions == 7


def test_load_from_a_file_and_from_arguments(tmp_path: Path) -> None:
    file = tmp_path / "client.yml"
    file.write_text(DEV_YAML, encoding="utf-8")
    from_file = WaltzClientConfig.load(str(file))
    assert from_file.zookeeper is not None and from_file.zookeeper.connect_string == "127.0.0.1:2181"
    assert client_config(file).max_concurrent_transactions == 7
    # Arguments win over the file's keys, as -z/-r over a command's config.
    overridden = WaltzClientConfig.load(file, cluster_root="/other")
    assert overridden.zookeeper is not None and overridden.zookeeper.cluster_root == "/other"
    assert overridden.max_concurrent_transactions == 7
    bare = client_config(None, zookeeper="127.0.0.1:2999", cluster_root="/bare")
    assert bare.zookeeper is not None and bare.zookeeper.connect_string == "127.0.0.1:2999"


def test_load_without_a_cluster_says_how_to_give_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    if find_dev_client_config(tmp_path.parent) is not None:
        pytest.skip("a dev cluster runs above the temporary directory")
    with pytest.raises(ConfigError, match="no Waltz cluster given"):
        WaltzClientConfig.load()
