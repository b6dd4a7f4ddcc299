"""LocalCluster with real processes: up → verify passes, status, node faults, down, reuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cluster_support import local_cluster

from waltz_engine.common.config import Config
from waltz_engine.ops.devcluster import STATE_FILE_NAME, DevClusterError, LocalCluster


def test_up_status_kill_restart_down_and_reuse(tmp_path_factory: pytest.TempPathFactory) -> None:
    with local_cluster(tmp_path_factory, storages=2, servers=1, partitions=2) as cluster:
        status = cluster.status()
        assert status.healthy, status.to_json()
        assert [n.name for n in status.nodes] == ["storage-0", "storage-1", "server-0"]
        client = Config.load(cluster.client_config_path).as_dict()
        assert client["zookeeper.connectString"] == cluster.zookeeper
        assert client["cluster.root"] == cluster.cluster_root

        storage = cluster.storages[0]
        storage.kill()
        assert not storage.is_running()
        assert not cluster.status().healthy
        storage.restart()
        cluster.wait_verified()
        assert cluster.status().healthy

        storage.pause()
        assert not storage.status().healthy  # holds its port but answers nothing
        storage.resume()
        assert storage.is_healthy()

        # Another process (here: another object) sees the same pids through the state file.
        other = LocalCluster.open(cluster.directory)
        assert [n.pid for n in other.nodes] == [n.pid for n in cluster.nodes]
        ports = {n.name: n.ports for n in cluster.nodes}
        other.down()  # stop from an object that did not start the processes
        assert not cluster.is_running()
        state = json.loads((cluster.directory / STATE_FILE_NAME).read_text())
        assert all(n["pid"] is None for n in state["storages"] + state["servers"])

        again = LocalCluster(cluster.directory, 2, 1, 2)
        again.up()
        assert {n.name: n.ports for n in again.nodes} == ports
        assert again.status().healthy
        pids = [n.pid for n in again.nodes]
    # The fixture's down() (on the first object) stops what `again` started: pids come from the state.
    assert all(pid is not None for pid in pids)
    assert not again.is_running()


def test_reusing_a_directory_with_another_topology_is_refused(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, 1, 0, 1)
    cluster._save_state()  # only the state file: nothing is started
    with pytest.raises(DevClusterError, match="holds a cluster of 1 storage nodes, 0 servers"):
        LocalCluster(tmp_path, 3, 1, 4)


def test_status_of_a_directory_without_cluster_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DevClusterError, match="no local cluster in"):
        LocalCluster.open(tmp_path)
