"""Issue 25 with one real storage node: sealed, committed segments go to a `file://` tier (and
to S3 through a local moto server), the oldest leave the local disk, reads of them come back
from the tier checked record by record (a bit flipped in a tier object is refused, naming the
record), and a restarted node finds its evicted range again from its manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from moto_support import moto_s3_url
from storage_node_support import directory_digest, flip_data_bits, make_records
from tier_support import (
    DATA_BYTES,
    PER_SEGMENT,
    RECORDS,
    ROTTEN,
    read,
    refusal_of,
    tier_node,
    write_and_evict,
)

from waltz_engine.ops.inspect import inspect_control
from waltz_engine.storage.tier.offload import replica_name


def test_offload_evict_read_back_refuse_a_flipped_bit_and_restart(zookeeper: str, tmp_path: Path) -> None:
    tier = tmp_path / "tier"
    with tier_node(zookeeper, tmp_path / "node", tier.as_uri()) as node:
        write_and_evict(node)
        key = node.key
        prefix = tier / str(key) / "0" / replica_name(node.host, node.port)
        manifest = json.loads((prefix / "manifest.json").read_text())
        assert [s["first_txid"] for s in manifest["segments"]] == [0, 10, 20]
        (partition,) = inspect_control(node.directory)["partitions"]
        local_files = list((node.directory / "0").iterdir())
        assert (partition["local_segments"], partition["local_bytes"]) == (
            2,
            sum(f.stat().st_size for f in local_files),
        )
        local = directory_digest(node.directory / "0")

        expected = make_records(0, RECORDS, size_bytes=DATA_BYTES)
        assert node.run(read(node, 0, RECORDS)) == expected

        flip_data_bits(prefix, [ROTTEN])
        assert node.run(read(node, 0, ROTTEN)) == expected[:ROTTEN]
        refusal = node.run(refusal_of(node, ROTTEN))
        assert f"corrupt record: partition 0 transaction {ROTTEN}" in refusal, refusal
        assert "differs from what was uploaded" in node.log_text()

        node.kill()
        node.start()
        assert node.run(read(node, PER_SEGMENT, RECORDS - PER_SEGMENT)) == expected[PER_SEGMENT:]
        # Reads change no local file. The restarted node's own offload round may evict a segment
        # more (its open segment is a new one), so files may be gone, never rewritten.
        after = directory_digest(node.directory / "0")
        assert after and all(local.get(name) == digest for name, digest in after.items()), (local, after)


def test_offload_evict_and_read_back_over_s3(
    zookeeper: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = make_records(0, RECORDS, size_bytes=DATA_BYTES)
    with (
        moto_s3_url("tier", "waltz", monkeypatch) as url,
        tier_node(zookeeper, tmp_path / "node", url) as node,
    ):
        write_and_evict(node)
        assert node.run(read(node, 0, RECORDS)) == expected
        node.kill()
        node.start()
        assert node.run(read(node, 0, RECORDS)) == expected
