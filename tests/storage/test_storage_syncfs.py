"""Where one ``syncfs`` may stand for the files' own syncs (issue 33): the kernel's version and
the file system of the data directory, read from ``/proc/self/mountinfo`` by its device."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from waltz_engine.common.config import Config, ConfigError
from waltz_engine.storage.held_append import SharedSync
from waltz_engine.storage.node.config import StorageConfig
from waltz_engine.storage.syncfs import FileSystemSync, kernel_version, mount_type


def test_kernel_versions() -> None:
    assert kernel_version("6.18.44-fc-v595") == (6, 18)
    assert kernel_version("5.8.0") == (5, 8)
    assert kernel_version("4.19.0-17-amd64") == (4, 19)
    assert kernel_version("5.10rc1") == (5, 10)
    assert kernel_version("unknown") is None


def test_the_mount_of_a_directory_by_its_device(tmp_path: Path) -> None:
    device = os.stat(tmp_path).st_dev
    mine = f"{os.major(device)}:{os.minor(device)}"
    mountinfo = (
        "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
        f"25 1 {mine} / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        f"30 25 {mine} / /data rw master:2 - xfs /dev/vdb rw\n"
    )
    assert mount_type(tmp_path, mountinfo) == "xfs"  # the last line of the device: mounted over
    assert mount_type(tmp_path, "22 1 0:21 / /proc rw - proc proc rw\n") is None


def test_syncfs_reports_a_directory_that_is_not_there(tmp_path: Path) -> None:
    whole = FileSystemSync(tmp_path)
    whole.sync()
    whole.sync()  # the same descriptor again
    whole.close()
    whole.close()
    with pytest.raises(OSError):
        FileSystemSync(tmp_path / "missing").sync()


def test_the_sync_scope_key(tmp_path: Path) -> None:
    base = {"storage.port": 1, "storage.admin.port": 2, "storage.directory": str(tmp_path)}
    base |= {"zookeeper.connectString": "localhost:2181", "zookeeper.sessionTimeout": 30000}
    base |= {"cluster.root": "/c"}
    assert StorageConfig.from_config(Config(base, "t.yaml")).sync_scope == "auto"
    config = StorageConfig.from_config(Config({**base, "storage.sync.scope": "file"}, "t.yaml"))
    assert config.sync_scope == "file"
    with pytest.raises(ConfigError, match="storage.sync.scope' is 'disk': one of auto, file, file-system"):
        StorageConfig.from_config(Config({**base, "storage.sync.scope": "disk"}, "t.yaml"))


class _Whole:
    """A whole-disk sync whose next ``failing`` syncs fail, as a kernel reports a failed
    writeback: to one ``syncfs`` caller of the descriptor only."""

    def __init__(self) -> None:
        self.failing = 0
        self.syncs = 0

    def sync(self) -> None:
        self.syncs += 1
        if self.failing:
            self.failing -= 1
            raise OSError(errno.EIO, "Input/output error")

    def close(self) -> None:
        pass


def test_a_pass_that_wrote_before_another_pass_s_failed_sync_fails_too() -> None:
    """Pass A's sync writes back what pass B wrote before it; when that fails, A gets the error
    and B's own sync returns 0: B must fail all the same (its records may be lost with A's)."""
    whole = _Whole()
    shared = SharedSync(whole)
    mark_a, mark_b = shared.mark(), shared.mark()  # both passes wrote
    whole.failing = 1
    with pytest.raises(OSError, match="Input/output error"):
        shared.sync(mark_a)
    with pytest.raises(OSError, match="earlier whole-disk sync failed"):
        shared.sync(mark_b)  # the kernel says 0 this time
    shared.sync(shared.mark())  # a pass that wrote after the failure: its own sync counts
    assert whole.syncs == 3
