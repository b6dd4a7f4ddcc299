"""A node process shows as the command that started it in `ps`, not as `python -c ...`."""

from __future__ import annotations

from pathlib import Path

from storage_node_support import start_storage_node


def test_a_storage_node_shows_as_waltz_storage_start(zookeeper: str, tmp_path: Path) -> None:
    with start_storage_node(zookeeper, tmp_path, 1) as node:
        title = Path(f"/proc/{node.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        assert title.startswith("waltz storage start --config "), title
        assert title.endswith(".yml") or title.endswith(".yaml"), title
