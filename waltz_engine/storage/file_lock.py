"""The exclusive lock a storage node holds on its control file's header.

``fcntl.lockf`` takes a POSIX record lock (``F_SETLK``), the kind Java's ``FileChannel.tryLock``
takes on Linux, so a Java node and ours exclude each other on the same directory.

POSIX record locks belong to a process, not to a file descriptor: a second lock from the
same process succeeds, and closing *any* descriptor of the file drops the lock. So this
module also keeps a per-process registry, checked *before* a descriptor is opened, and
code that only reads a locked control file must not open and close it in the same
process while a node holds it.
"""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import threading
from pathlib import Path

from waltz_engine.common.errors import StorageError
from waltz_engine.storage.constants import CONTROL_LOCK_SIZE_BYTES, CONTROL_LOCK_START_BYTES

# Linux `struct flock`: l_type, l_whence (short), l_start, l_len (off_t), l_pid (pid_t), padded.
_FLOCK = struct.Struct("@hhqqi")
_FLOCK_SIZE_BYTES = 32

_registry_guard = threading.Lock()
_locked_files: set[tuple[int, int]] = set()


def _holder_pid(fd: int) -> int | None:
    """The pid holding a conflicting lock on the header, where the platform tells."""
    if not sys.platform.startswith("linux"):
        return None
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, CONTROL_LOCK_START_BYTES, CONTROL_LOCK_SIZE_BYTES, 0)
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query.ljust(_FLOCK_SIZE_BYTES, b"\0"))
    except OSError:
        return None
    lock_type, _, _, _, pid = _FLOCK.unpack_from(answer)
    return pid if lock_type != fcntl.F_UNLCK and pid > 0 else None


def _in_use(directory: Path, pid: int | None) -> StorageError:
    who = f"pid {pid}" if pid is not None else "pid unknown"
    return StorageError(f"storage directory {directory} is in use by another process ({who})")


class HeaderLock:
    """An open control file descriptor whose header bytes this process has locked."""

    def __init__(self, fd: int, identity: tuple[int, int]) -> None:
        self.fd = fd
        self._identity = identity

    @classmethod
    def open(cls, path: Path, *, shared: bool = False) -> HeaderLock:
        """Open (creating if absent) and lock ``path``, or raise StorageError naming the holder.

        ``shared``: open read-only, never create, and take a read lock (the read-only open of a
        stopped node's directory): it conflicts with a running node's lock as the write lock does.
        """
        with _registry_guard:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                if shared:
                    raise StorageError(f"{path.parent} is not a storage directory (no {path.name})") from None
            else:
                if (st.st_dev, st.st_ino) in _locked_files:
                    raise _in_use(path.parent, os.getpid())
            fd = os.open(path, os.O_RDONLY) if shared else os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            st = os.fstat(fd)
            identity = (st.st_dev, st.st_ino)
            try:
                fcntl.lockf(
                    fd,
                    (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB,
                    CONTROL_LOCK_SIZE_BYTES,
                    CONTROL_LOCK_START_BYTES,
                    os.SEEK_SET,
                )
            except OSError as e:
                pid = _holder_pid(fd)
                os.close(fd)
                raise _in_use(path.parent, pid) from e
            _locked_files.add(identity)
            return cls(fd, identity)

    def close(self) -> None:
        """Release the lock by closing the descriptor (that is what releases POSIX locks)."""
        with _registry_guard:
            if self.fd < 0:
                return
            os.close(self.fd)
            self.fd = -1
            _locked_files.discard(self._identity)
