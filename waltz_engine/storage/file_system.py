"""The storage engine's file system seam.

The engine (control file, partitions, segments, refills) reaches files only through a
:class:`Disk` it receives at construction and the :class:`DiskFile` handles it opens.
Production passes :data:`OS_DISK`: the ``os`` calls the engine always made, so the bytes on
disk are the same. The simulator passes an in-memory disk that loses unsynced writes on a
crash (waltz_engine/sim/disk.py).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from waltz_engine.common.fileio import Bytes, DiskFile, fsync_directory
from waltz_engine.storage.file_lock import HeaderLock
from waltz_engine.storage.syncfs import FileSystemSync, syncfs_safe


class Disk(Protocol):
    """The directory operations the engine needs; paths are the engine's own."""

    def open(self, path: Path, *, create: bool = False, exclusive: bool = False) -> DiskFile:
        """Open for reading and writing; ``create`` makes a missing file, ``exclusive`` refuses an
        existing one (FileExistsError); a missing file otherwise raises FileNotFoundError."""
        ...

    def fsync_directory(self, directory: Path) -> None:
        """Make created, renamed or deleted names in ``directory`` durable."""
        ...

    def rename(self, source: Path, target: Path) -> None: ...

    def unlink(self, path: Path, *, missing_ok: bool = False) -> None: ...

    def exists(self, path: Path) -> bool: ...

    def file_size_bytes(self, path: Path) -> int: ...

    def glob(self, directory: Path, pattern: str) -> list[Path]:
        """The names in ``directory`` matching ``pattern`` (``Path.glob`` syntax), in no order."""
        ...

    def mkdir(self, directory: Path, *, parents: bool = False) -> None:
        """Create ``directory`` unless it exists."""
        ...

    def open_locked(self, path: Path) -> DiskFile:
        """Open (creating) a control file and take this process's lock on its header; a
        StorageError names the holder when another process or node has it. Closing unlocks."""
        ...

    def whole_sync(self, directory: Path) -> WholeSync:
        """The sync of every file written on the file system of ``directory`` (``syncfs``): what
        an ``fsync`` of each would, in one call."""
        ...

    def sync_all_safe(self, directory: Path) -> tuple[bool, str]:
        """Whether :meth:`whole_sync` reports every file's write error and flushes the device's
        cache for ``directory`` (so it may stand for the files' own syncs), and why."""
        ...


class WholeSync(Protocol):
    """A node's handle on the whole-disk sync of its data directory (:meth:`Disk.whole_sync`)."""

    def sync(self) -> None:
        """Every file written on that file system durable; an OSError when any of them failed."""
        ...

    def close(self) -> None: ...


class CallSync:
    """A :class:`WholeSync` that calls ``sync`` (a disk with no descriptor to keep)."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.sync = sync

    def close(self) -> None:
        pass


class OsFile:
    """A real file descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def pread(self, size_bytes: int, offset: int) -> bytes:
        return os.pread(self.fd, size_bytes, offset)

    def pwrite(self, data: Bytes, offset: int) -> int:
        return os.pwrite(self.fd, data, offset)

    def size_bytes(self) -> int:
        return os.fstat(self.fd).st_size

    def truncate(self, size_bytes: int) -> None:
        os.ftruncate(self.fd, size_bytes)

    def fsync(self) -> None:
        os.fsync(self.fd)

    def fdatasync(self) -> None:
        os.fdatasync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


class LockedOsFile(OsFile):
    """A control file whose header this process has locked; closing it releases the lock."""

    def __init__(self, lock: HeaderLock) -> None:
        super().__init__(lock.fd)
        self._lock = lock

    def close(self) -> None:
        self._lock.close()


class OsDisk:
    """The machine's file system, through the ``os`` calls."""

    def open(self, path: Path, *, create: bool = False, exclusive: bool = False) -> OsFile:
        flags = os.O_RDWR | (os.O_CREAT if create else 0) | (os.O_EXCL if exclusive else 0)
        return OsFile(os.open(path, flags, 0o666))

    def fsync_directory(self, directory: Path) -> None:
        fsync_directory(directory)

    def rename(self, source: Path, target: Path) -> None:
        os.rename(source, target)

    def unlink(self, path: Path, *, missing_ok: bool = False) -> None:
        path.unlink(missing_ok=missing_ok)

    def exists(self, path: Path) -> bool:
        return path.exists()

    def file_size_bytes(self, path: Path) -> int:
        return path.stat().st_size

    def glob(self, directory: Path, pattern: str) -> list[Path]:
        return list(directory.glob(pattern))

    def mkdir(self, directory: Path, *, parents: bool = False) -> None:
        directory.mkdir(parents=parents, exist_ok=True)

    def open_locked(self, path: Path) -> LockedOsFile:
        return LockedOsFile(HeaderLock.open(path))

    def whole_sync(self, directory: Path) -> WholeSync:
        return FileSystemSync(directory)

    def sync_all_safe(self, directory: Path) -> tuple[bool, str]:
        return syncfs_safe(directory)


OS_DISK = OsDisk()


class ReadOnlyWriteError(AssertionError):
    """Code under a read-only open tried to change a file: a bug (a check must never write)."""


class _RefusesWrites:
    """A descriptor opened ``O_RDONLY``; a write is refused before the kernel would refuse it."""

    def pwrite(self, data: Bytes, offset: int) -> int:
        raise ReadOnlyWriteError("a read-only open tried to write a file")

    def truncate(self, size_bytes: int) -> None:
        raise ReadOnlyWriteError("a read-only open tried to truncate a file")

    def fsync(self) -> None:
        """Nothing of ours to make durable (closing a control file syncs it)."""

    def fdatasync(self) -> None:
        raise ReadOnlyWriteError("a read-only open tried to sync a file's writes")


class ReadOnlyOsFile(_RefusesWrites, OsFile):
    """A file of a read-only open."""


class ReadOnlyLockedOsFile(_RefusesWrites, LockedOsFile):
    """A control file opened read-only under a shared lock on its header."""


class ReadOnlyOsDisk(OsDisk):
    """The machine's file system, for the read-only open (``StorageManager.open_read_only``):
    files open ``O_RDONLY``, the control file under a shared lock (a running node's lock
    conflicts with it), and every call that would create, rename or remove a name fails."""

    def open(self, path: Path, *, create: bool = False, exclusive: bool = False) -> OsFile:
        if create:
            raise ReadOnlyWriteError(f"a read-only open tried to create {path}")
        return ReadOnlyOsFile(os.open(path, os.O_RDONLY))

    def fsync_directory(self, directory: Path) -> None:
        raise ReadOnlyWriteError(f"a read-only open tried to sync {directory}")

    def rename(self, source: Path, target: Path) -> None:
        raise ReadOnlyWriteError(f"a read-only open tried to rename {source}")

    def unlink(self, path: Path, *, missing_ok: bool = False) -> None:
        raise ReadOnlyWriteError(f"a read-only open tried to remove {path}")

    def mkdir(self, directory: Path, *, parents: bool = False) -> None:
        raise ReadOnlyWriteError(f"a read-only open tried to create {directory}")

    def open_locked(self, path: Path) -> LockedOsFile:
        return ReadOnlyLockedOsFile(HeaderLock.open(path, shared=True))

    def whole_sync(self, directory: Path) -> WholeSync:
        raise ReadOnlyWriteError(f"a read-only open tried to sync {directory}")


READ_ONLY_OS_DISK = ReadOnlyOsDisk()


class ClosedFile:
    """The handle of a file that is not open: every call fails as on a closed descriptor."""

    def _closed(self) -> OSError:
        return OSError(errno.EBADF, "the file is closed")

    def pread(self, size_bytes: int, offset: int) -> bytes:
        raise self._closed()

    def pwrite(self, data: Bytes, offset: int) -> int:
        raise self._closed()

    def size_bytes(self) -> int:
        raise self._closed()

    def truncate(self, size_bytes: int) -> None:
        raise self._closed()

    def fsync(self) -> None:
        raise self._closed()

    def fdatasync(self) -> None:
        raise self._closed()

    def close(self) -> None:
        raise self._closed()


CLOSED_FILE: DiskFile = ClosedFile()
