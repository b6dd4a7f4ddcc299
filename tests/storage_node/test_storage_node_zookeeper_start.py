"""Issue 13 item 7: a storage node started while ZooKeeper is down waits for it (with backoff,
up to `storage.zookeeper.start.timeout.ms`) instead of exiting at once."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from storage_node_support import StorageNodeProcess, create_test_cluster, free_tcp_port, run_waltz

from waltz_engine.zk.server import EmbeddedZooKeeper

RETRY_LOG_TIMEOUT_S = 30.0


def _wait_for_log(node: StorageNodeProcess, text: str) -> None:
    deadline = time.monotonic() + RETRY_LOG_TIMEOUT_S
    while text not in node.log_text():
        assert node.running, f"the node exited:\n{node.log_text()}"
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{node.log_text()}"
        time.sleep(0.1)


def test_node_waits_for_zookeeper_then_serves(tmp_path: Path) -> None:
    zookeeper = EmbeddedZooKeeper(tmp_path / "zookeeper", free_tcp_port())
    zookeeper.start()
    try:
        root, key = create_test_cluster(zookeeper.connect_string, 1)
    finally:
        zookeeper.stop()
    node = StorageNodeProcess(zookeeper.connect_string, root, key, 1, tmp_path / "node", jetty=False)
    node.start(wait=False)
    try:
        _wait_for_log(node, "retrying in")
        zookeeper.start()  # the same data directory: the cluster is still there
        node.wait_ready()
        assert "gave up" not in node.log_text()
    finally:
        node.close()
        zookeeper.stop()


def test_node_gives_up_after_the_configured_limit_with_one_line(tmp_path: Path) -> None:
    nobody = f"127.0.0.1:{free_tcp_port()}"
    node = StorageNodeProcess(
        nobody,
        "/nowhere",
        uuid.uuid4(),
        1,
        tmp_path,
        jetty=False,
        extra_config={"storage.zookeeper.start.timeout.ms": 1_500},
    )
    result = run_waltz("storage", "start", "--config", str(node.config_path))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "gave up after 1500 ms ('storage.zookeeper.start.timeout.ms')" in errors[0]
    assert f"cannot connect to ZooKeeper at {nobody}" in errors[0]
