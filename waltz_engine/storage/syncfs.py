"""One sync for a whole file system (Linux ``syncfs(2)``), and whether it may stand for per-file syncs.

A storage node's disk pass of several partitions can make all their segments durable with one
``syncfs`` instead of one ``fdatasync`` each (docs/storage-nodes.md, "One sync per disk pass"):
the kernel's ``fdatasync`` costs ~100 us of CPU per file on a virtualised disk (a journal commit
and a device flush each), one ``syncfs`` about the same for all of a pass's files. It is only safe
where ``syncfs`` reports a failed writeback of any file (Linux 5.8 and later: the errseq change;
before, it returned 0 after a failed writeback) and where the file system flushes the device's
cache on it (the local journaling ones below). Python has no ``os.syncfs``: libc's is called
through ctypes (which releases the GIL for the call).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

# File systems whose syncfs writes every dirty inode, commits the journal and flushes the
# device's write cache (as their fsync does).
SYNCFS_FILE_SYSTEMS = frozenset({"ext4", "xfs", "btrfs"})
# syncfs reports writeback errors of the file system's files from this kernel on.
SYNCFS_MIN_KERNEL = (5, 8)
MOUNTINFO = Path("/proc/self/mountinfo")


def _libc_syncfs() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_SYNCFS = _libc_syncfs()


class FileSystemSync:
    """``syncfs`` of the file system holding ``directory``, through one descriptor kept open.

    One descriptor for the node's life, because the kernel reports a failed writeback to each
    open descriptor of the file system once (``errseq``, per open file): a descriptor opened
    for each sync would miss an error that another process's ``syncfs`` saw first. Opened at
    the first sync (the directory may not exist yet when the node starts)."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._fd: int | None = None

    def sync(self) -> None:
        """OSError as the kernel reports it (or the directory cannot be opened)."""
        if _SYNCFS is None:
            raise OSError(0, "syncfs is not available on this system", str(self._directory))
        if self._fd is None:
            self._fd = os.open(self._directory, os.O_RDONLY)
        if _SYNCFS(self._fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(self._directory))

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def kernel_version(release: str) -> tuple[int, int] | None:
    """(major, minor) of a ``uname -r`` string such as ``6.18.44-fc``; None when unreadable."""
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match[1]), int(match[2])) if match else None


def mount_type(directory: Path, mountinfo: str) -> str | None:
    """The file system type of the mount holding ``directory`` (by its device number), from
    the text of ``/proc/self/mountinfo``; None when no mount line names that device."""
    device = os.stat(directory).st_dev
    wanted = f"{os.major(device)}:{os.minor(device)}"
    found = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[2] != wanted or " - " not in line:
            continue
        after = line.split(" - ", 1)[1].split()
        if after:
            found = after[0]  # a later line of the same device is mounted over: it is the one seen
    return found


def syncfs_safe(directory: Path) -> tuple[bool, str]:
    """Whether a ``syncfs`` of ``directory``'s file system makes its files durable and reports
    their errors as their own syncs would, with the reason in words (logged and shown)."""
    if _SYNCFS is None:
        return False, f"no syncfs on this system ({sys.platform})"
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent  # not made yet: it will be on its parent's file system
    release = os.uname().release
    version = kernel_version(release)
    if version is None or version < SYNCFS_MIN_KERNEL:
        minimum = ".".join(map(str, SYNCFS_MIN_KERNEL))
        return False, f"kernel {release} is older than {minimum} (its syncfs does not report write errors)"
    try:
        kind = mount_type(directory, MOUNTINFO.read_text())
    except OSError as e:
        return False, f"the file system of {directory} could not be read ({e})"
    if kind is None:
        return False, f"no mount of {directory} found in {MOUNTINFO}"
    if kind not in SYNCFS_FILE_SYSTEMS:
        return False, f"{directory} is on {kind}, not one of {', '.join(sorted(SYNCFS_FILE_SYSTEMS))}"
    return True, f"{directory} is on {kind}, kernel {release}"
