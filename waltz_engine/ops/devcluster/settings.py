"""What `dev up --replicas` and `--set` change: where each partition lives, and extra
configuration keys for every node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from waltz_engine.common.config import Config
from waltz_engine.ops.devcluster.nodes import DevClusterError

# Keys `dev up` derives from the cluster's state (where each node listens, keeps its data and
# finds the others): a --set of one would part the nodes from what `status` and `down` know.
PLACEMENT_KEYS = frozenset(
    {
        "zookeeper.connectString",
        "cluster.root",
        "storage.host",
        "storage.port",
        "storage.admin.port",
        "storage.jetty.port",
        "storage.directory",
        "server.host",
        "server.advertisedHost",
        "server.port",
        "server.jetty.port",
    }
)


def parse_setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE read as a YAML scalar (``1048576`` a number, ``true`` a boolean)."""
    key, equals, raw = text.partition("=")
    key = key.strip()
    if not equals or not key:
        raise DevClusterError(f"{text!r}: give KEY=VALUE, e.g. storage.segment.size.threshold=1048576")
    if key in PLACEMENT_KEYS:
        raise DevClusterError(f"{key} is chosen by `dev up` (ports, directories, ZooKeeper); not settable")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    if value is None or isinstance(value, dict | list):
        raise DevClusterError(f"{text!r}: the value must be one number, boolean or string")
    return key, value


def unknown_keys(settings: Mapping[str, Any]) -> list[str]:
    """The keys no node reads (misspelled, or of another version): nodes warn and ignore them."""
    # Imported here: the node modules behind these lists are not needed for the CLI to start.
    from waltz_engine.server import config as server_config
    from waltz_engine.storage.node import config as storage_config

    known = (*storage_config.KNOWN_KEYS, *server_config.KNOWN_KEYS)
    prefixes = (*storage_config.KNOWN_PREFIXES, *server_config.KNOWN_PREFIXES)
    return Config(dict(settings), "--set").unknown_keys(known, prefixes)


STORAGE_NODE = "storage"
SERVER_NODE = "server"


def settings_for(kind: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The ``--set`` keys a node of ``kind`` (storage or server) reads, for its YAML alone: a
    key one kind reads is not written for the other (which would warn about it). A key no node
    reads goes to both, whose warnings name it (as `dev up` does)."""
    from waltz_engine.server import config as server_config
    from waltz_engine.storage.node import config as storage_config

    assert kind in (STORAGE_NODE, SERVER_NODE)
    readers = {
        STORAGE_NODE: (storage_config.KNOWN_KEYS, storage_config.KNOWN_PREFIXES),
        SERVER_NODE: (server_config.KNOWN_KEYS, server_config.KNOWN_PREFIXES),
    }

    def reads(node_kind: str, key: str) -> bool:
        keys, prefixes = readers[node_kind]
        return key in keys or key.startswith(prefixes)

    return {
        key: value
        for key, value in settings.items()
        if reads(kind, key) or not any(reads(other, key) for other in readers)
    }


def replica_indexes(partition: int, storages: int, replicas: int) -> list[int]:
    """The storage nodes (indexes) of ``partition``: ``replicas`` consecutive ones, starting one
    further along for each partition, so that every node holds about as many partitions."""
    assert 1 <= replicas <= storages
    return sorted((partition + k) % storages for k in range(replicas))


def partitions_of(node: int, storages: int, replicas: int, partitions: int) -> list[int]:
    return [p for p in range(partitions) if node in replica_indexes(p, storages, replicas)]
