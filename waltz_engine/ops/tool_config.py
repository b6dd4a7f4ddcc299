"""Where a command finds the cluster and its TLS keys: a tool's config file, else the local dev
cluster's (``.waltz-dev/client.yml``), with ``-z``/``-r`` winning over its keys (docs/cli.md)."""

from __future__ import annotations

import logging
from pathlib import Path

from waltz_engine.client.config import KNOWN_KEYS as CLIENT_KEYS
from waltz_engine.common.config import Config, resolve_config_path
from waltz_engine.zk.connection import KNOWN_KEYS as ZOOKEEPER_KEYS
from waltz_engine.zk.connection import ZooKeeperSettings

# Keys a tool's config may hold beside ZooKeeper's: the client's (a client YAML serves every
# command) and TLS for the tool's own connections (``ssl.``), to storage nodes (``server.ssl.``) or
# the client's to servers (``client.ssl.``, read by `append` and `tail`).
TOOL_KNOWN_PREFIXES = ("ssl.", "server.ssl.", "client.ssl.")
_warned_sources: set[str] = set()
_CONFIG_LOGGER = logging.getLogger("waltz_engine.common.config")


def load_tool_config(config_path: Path | None) -> Config | None:
    """A command's config: ``config_path``, else the local dev cluster's client config, else None.

    Unknown keys (a misspelling, most often) are logged once per file as warnings; they are
    still ignored, as the original does.
    """
    path = resolve_config_path(config_path)
    if path is None:
        return None
    config = Config.load(path)
    if config.source not in _warned_sources:
        _warned_sources.add(config.source)
        config.warn_unknown_keys((*ZOOKEEPER_KEYS, *CLIENT_KEYS), _CONFIG_LOGGER.warning, TOOL_KNOWN_PREFIXES)
    return config


def load_settings(
    config_path: Path | None,
    zookeeper: str | None,
    cluster_root: str | None,
    connect_timeout_ms: int | None = None,
) -> ZooKeeperSettings:
    """Explicit values, else the config file (or the dev cluster's), see :func:`load_tool_config`."""
    config = load_tool_config(config_path)
    return ZooKeeperSettings.resolve(
        zookeeper=zookeeper, cluster_root=cluster_root, config=config, connect_timeout_ms=connect_timeout_ms
    )
