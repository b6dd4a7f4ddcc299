"""Issue 25, a storage node with a tier killed during an upload (reached with a slow rate),
during an eviction and during a read back (reached with the tier's kill hook): nothing is lost,
the manifest names only whole objects, and the reads complete after the restart."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from pathlib import Path

import pytest
import yaml
from storage_node_support import directory_digest, make_records
from tier_support import (
    DATA_BYTES,
    PER_SEGMENT,
    POLL_S,
    POLLS,
    RECORDS,
    local_segments,
    read,
    tier_node,
    wait_evicted,
    write,
)

from waltz_engine.common.errors import WaltzError
from waltz_engine.storage.tier.offload import replica_name
from waltz_engine.storage.tier.reads import KILL_AT_ENV


def test_a_node_killed_during_an_upload_loses_nothing_and_finishes_after_restart(
    zookeeper: str, tmp_path: Path
) -> None:
    tier = tmp_path / "tier"
    with tier_node(zookeeper, tmp_path / "node", tier.as_uri()) as node:
        fast = yaml.safe_load(node.config_path.read_text())
        node.config_path.write_text(yaml.safe_dump({**fast, "storage.tier.bytes.per.second": 100}))
        node.start()
        node.assign()
        node.run(write(node))
        debris = tier / str(node.key) / ".tmp" / replica_name(node.host, node.port)
        for _ in range(POLLS):  # an object written, its upload waiting on the rate limit
            if debris.is_dir() and any(debris.iterdir()):
                break
            time.sleep(POLL_S)
        assert debris.is_dir() and any(debris.iterdir()), node.log_text()
        node.kill()

        prefix = tier / str(node.key) / "0" / replica_name(node.host, node.port)
        manifest = prefix / "manifest.json"
        named = json.loads(manifest.read_text())["segments"] if manifest.exists() else []
        for segment in named:  # never an incomplete object
            for suffix in ("seg", "idx"):
                data = (prefix / f"{segment['first_txid']:019d}.{suffix}").read_bytes()
                assert len(data) == segment[suffix]["size"]
                assert hashlib.sha256(data).hexdigest() == segment[suffix]["sha256"]
        assert len(local_segments(node)) == RECORDS // PER_SEGMENT  # nothing removed locally

        node.config_path.write_text(yaml.safe_dump(fast))
        node.start()
        wait_evicted(node)
        assert not any(debris.iterdir())
        assert node.run(read(node, 0, RECORDS)) == make_records(0, RECORDS, size_bytes=DATA_BYTES)


def test_a_node_killed_during_an_eviction_and_during_a_tier_read_loses_nothing(
    zookeeper: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = tmp_path / "tier"
    expected = make_records(0, RECORDS, size_bytes=DATA_BYTES)
    with tier_node(zookeeper, tmp_path / "node", tier.as_uri()) as node:
        monkeypatch.setenv(KILL_AT_ENV, "evict")
        node.start()
        node.assign()
        node.run(write(node))
        assert node.wait_exit() == -signal.SIGKILL  # once segment 0's files were removed
        assert local_segments(node) == [f"{first:019d}.seg" for first in (10, 20, 30)]

        monkeypatch.setenv(KILL_AT_ENV, "read")
        node.start()  # finds segment 0 in the tier, evicts segment 10
        wait_evicted(node)
        with pytest.raises(WaltzError):
            node.run(read(node, 0, 1))
        assert node.wait_exit() == -signal.SIGKILL  # once segment 0's data object was read back
        cache = node.directory / ".tier-cache" / "0"
        assert sorted(p.name for p in cache.iterdir()) == [f"{0:019d}.seg"]
        local = directory_digest(node.directory / "0")

        monkeypatch.delenv(KILL_AT_ENV)
        node.start()
        assert node.run(read(node, 0, RECORDS)) == expected
        assert directory_digest(node.directory / "0") == local
