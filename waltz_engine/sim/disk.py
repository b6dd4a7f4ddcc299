"""An in-memory disk for one simulated storage node: the storage engine's :class:`Disk` seam.

What it keeps, and what a crash takes:

* A file's bytes as the engine last wrote them, and as they were at its last ``fsync`` or
  ``fdatasync``: :meth:`SimDisk.crash` brings every file back to the synced bytes, except
  (``keep_torn_bytes``) a prefix of the last write, which reached the platter torn.
* Names: a created, renamed or deleted name is durable once its directory is synced, or (a new
  file, as ext4 does) once the file itself is ``fsync``ed; a crash brings back the durable names.
  Directories are durable when made (the engine never removes one).
* Media faults: :meth:`flip_bit` changes a byte in place, synced or not (rot in a sealed
  segment); a full disk (:attr:`capacity_bytes`) refuses a write that would grow it (ENOSPC);
  :meth:`crash_on_write` makes the process die in a later write (what of it survives is
  :meth:`crash`'s ``keep_torn_bytes``).
* A whole-disk sync (``sync_all``, Linux's ``syncfs``) makes every file's bytes durable at once;
  :attr:`SimDisk.failing_whole_syncs` makes the next ones fail (EIO) with nothing made durable.
* Time: each sync costs ``sync_latency_ms()``; the engine's call returns at once and
  :meth:`take_sync_delay_ms` tells the world how long it should have taken, so the world delays
  the completion through the loop (a slow fsync).

One process's lock on a control file is a name in a set; a crash releases it and makes every
open handle invalid, as a dead process's descriptors are.
"""

from __future__ import annotations

import errno
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from waltz_engine.common.errors import StorageError
from waltz_engine.common.fileio import Bytes
from waltz_engine.sim.loop import SimulatedCrash
from waltz_engine.storage.file_system import CallSync

__all__ = ["SimDisk", "SimFile", "SimulatedCrash"]


@dataclass
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""


@dataclass
class _TornWrite:
    inode: _Inode
    offset: int
    data: bytes


class SimFile:
    """An open handle; it dies with the process that opened it (a crash)."""

    def __init__(self, disk: SimDisk, inode: _Inode, path: Path, locked: bool = False) -> None:
        self._disk = disk
        self._inode = inode
        self._path = path
        self._generation = disk.generation
        self._locked = locked
        self._closed = False

    def _live(self) -> _Inode:
        if self._closed or self._generation != self._disk.generation:
            raise OSError(errno.EBADF, "the file is closed", str(self._path))
        return self._inode

    def pread(self, size_bytes: int, offset: int) -> bytes:
        with memoryview(self._live().data) as data:  # one copy, not a slice and then its bytes
            return data[offset : offset + size_bytes].tobytes()

    def pwrite(self, data: Bytes, offset: int) -> int:
        return self._disk._write(self._live(), bytes(data), offset)

    def size_bytes(self) -> int:
        return len(self._live().data)

    def truncate(self, size_bytes: int) -> None:
        inode = self._live()
        if size_bytes <= len(inode.data):
            del inode.data[size_bytes:]
        else:
            self._disk._grow(inode, size_bytes)

    def fsync(self) -> None:
        inode = self._live()
        self._disk._sync(inode)
        self._disk._name_inode_durable(inode)

    def fdatasync(self) -> None:
        self._disk._sync(self._live())

    def close(self) -> None:
        self._live()
        self._closed = True
        if self._locked:
            self._disk._locks.discard(self._path)


class SimDisk:
    """One node's disk. Paths are the engine's own (any absolute path; nothing touches the host)."""

    def __init__(
        self,
        capacity_bytes: int | None = None,
        sync_latency_ms: Callable[[], float] | None = None,
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self._sync_latency_ms = sync_latency_ms
        self._names: dict[Path, _Inode] = {}
        self._durable_names: dict[Path, _Inode] = {}
        self._directories: set[Path] = {Path("/")}
        self._locks: set[Path] = set()
        self._last_write: _TornWrite | None = None
        self._crash_countdown: int | None = None
        self._sync_delay_ms = 0.0
        self.generation = 0  # bumped by a crash: handles of the dead process stop working
        self._parents: dict[Path, Path] = {}  # each path's directory (pathlib builds a new one per ask)
        self.syncs = 0
        # The next whole-disk syncs (``sync_all``) that fail (EIO) and make nothing durable.
        self.failing_whole_syncs = 0

    # --- the world's controls ---------------------------------------------------------------

    def crash(self, keep_torn_bytes: int = 0) -> None:
        """The node dies: unsynced writes and names are lost (but ``keep_torn_bytes`` of the last
        write), locks released, handles invalid. The next process sees what stayed."""
        torn = self._last_write
        if torn is not None and keep_torn_bytes > 0:
            kept = bytearray(torn.inode.durable)
            piece = torn.data[:keep_torn_bytes]
            kept[len(kept) : torn.offset] = bytes(max(0, torn.offset - len(kept)))
            kept[torn.offset : torn.offset + len(piece)] = piece
            torn.inode.durable = bytes(kept)
        self._names = dict(self._durable_names)
        for inode in self._names.values():
            inode.data = bytearray(inode.durable)
        self._locks.clear()
        self._last_write = None
        self._crash_countdown = None
        self.generation += 1

    def crash_on_write(self, after_writes: int) -> None:
        """The process dies (:class:`SimulatedCrash`) in the ``after_writes``-th write from now;
        call :meth:`crash` next, which decides how much of that write reached the platter."""
        assert after_writes >= 1
        self._crash_countdown = after_writes

    def flip_bit(self, path: Path, offset: int, bit: int = 0) -> None:
        """Rot: one bit of ``path`` changes, in what is written and in what survives a crash."""
        inode = self._inode(path)
        mask = 1 << bit
        inode.data[offset] ^= mask
        if offset < len(inode.durable):
            durable = bytearray(inode.durable)
            durable[offset] ^= mask
            inode.durable = bytes(durable)

    def torn_write_size_bytes(self) -> int:
        """The size of the last write not yet synced (what a crash may keep a prefix of), or 0."""
        return len(self._last_write.data) if self._last_write is not None else 0

    @property
    def pending_sync_delay_ms(self) -> float:
        """The syncs' time charged since the last :meth:`take_sync_delay_ms`: the next sync of
        this pass begins that much later than the pass."""
        return self._sync_delay_ms

    def take_sync_delay_ms(self) -> float:
        """How long the syncs since the last call should have taken; the world waits that long."""
        delay, self._sync_delay_ms = self._sync_delay_ms, 0.0
        return delay

    def used_bytes(self) -> int:
        return sum(len(inode.data) for inode in self._names.values())  # no hard links here

    def read_bytes(self, path: Path) -> bytes:
        """A file's current bytes (for checks and comparisons)."""
        return bytes(self._inode(path).data)

    def files(self) -> list[Path]:
        return sorted(self._names)

    # --- the Disk protocol ------------------------------------------------------------------

    def open(self, path: Path, *, create: bool = False, exclusive: bool = False) -> SimFile:
        inode = self._names.get(path)
        if inode is not None and exclusive:
            raise FileExistsError(errno.EEXIST, "File exists", str(path))
        if inode is None:
            if not create:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
            self._check_directory(path.parent)
            inode = self._names[path] = _Inode()
        return SimFile(self, inode, path)

    def open_locked(self, path: Path) -> SimFile:
        if path in self._locks:
            raise StorageError(f"storage directory {path.parent} is in use by another process (pid unknown)")
        file = self.open(path, create=True)
        self._locks.add(path)
        file._locked = True
        return file

    def fsync_directory(self, directory: Path) -> None:
        self._check_directory(directory)
        parent = self._parent
        for path in [p for p in self._durable_names if parent(p) == directory and p not in self._names]:
            del self._durable_names[path]
        for path, inode in self._names.items():
            if parent(path) == directory:
                self._durable_names[path] = inode
        self._charge_sync()

    def rename(self, source: Path, target: Path) -> None:
        inode = self._inode(source)
        self._check_directory(target.parent)
        del self._names[source]
        self._names[target] = inode

    def unlink(self, path: Path, *, missing_ok: bool = False) -> None:
        if path not in self._names:
            if missing_ok:
                return
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        del self._names[path]

    def exists(self, path: Path) -> bool:
        return path in self._names or path in self._directories

    def file_size_bytes(self, path: Path) -> int:
        return len(self._inode(path).data)

    def glob(self, directory: Path, pattern: str) -> list[Path]:
        return sorted(
            p for p in self._names if self._parent(p) == directory and fnmatch.fnmatchcase(p.name, pattern)
        )

    def mkdir(self, directory: Path, *, parents: bool = False) -> None:
        if directory in self._directories:
            return
        if directory in self._names:
            raise FileExistsError(errno.EEXIST, "File exists", str(directory))
        if directory.parent not in self._directories:
            if not parents:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(directory.parent))
            self.mkdir(directory.parent, parents=True)
        self._directories.add(directory)

    def sync_all(self, directory: Path) -> None:
        """``syncfs``: every file's bytes durable, in one sync's time (a file's own sync also
        makes its new name durable, as ext4 does; a whole-disk sync here does not, to be strict)."""
        if self.failing_whole_syncs > 0:
            self.failing_whole_syncs -= 1
            self._charge_sync()
            raise OSError(errno.EIO, "Input/output error", str(directory))
        for inode in self._names.values():
            inode.durable = bytes(inode.data)
        self._last_write = None
        self._charge_sync()

    def whole_sync(self, directory: Path) -> CallSync:
        # (Looked up at each sync: tests and plants replace ``sync_all``.)
        return CallSync(lambda: self.sync_all(directory))

    def sync_all_safe(self, directory: Path) -> tuple[bool, str]:
        return True, "the simulator's disk"

    # --- inside -------------------------------------------------------------------------------

    def _parent(self, path: Path) -> Path:
        parent = self._parents.get(path)
        if parent is None:
            parent = self._parents[path] = path.parent
        return parent

    def _inode(self, path: Path) -> _Inode:
        inode = self._names.get(path)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        return inode

    def _check_directory(self, directory: Path) -> None:
        if directory not in self._directories:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(directory))

    def _grow(self, inode: _Inode, size_bytes: int) -> None:
        growth = size_bytes - len(inode.data)
        self._check_room(growth)
        inode.data.extend(bytes(growth))

    def _check_room(self, growth_bytes: int) -> None:
        if self.capacity_bytes is not None and self.used_bytes() + growth_bytes > self.capacity_bytes:
            raise OSError(errno.ENOSPC, "No space left on device")

    def _write(self, inode: _Inode, data: bytes, offset: int) -> int:
        crashing = False
        if self._crash_countdown is not None:
            self._crash_countdown -= 1
            crashing = self._crash_countdown == 0
        if data and offset == len(inode.data):  # at the end (the usual write): no zeros to overwrite
            self._check_room(len(data))
            inode.data += data
        else:
            if offset + len(data) > len(inode.data):
                self._grow(inode, offset + len(data))
            inode.data[offset : offset + len(data)] = data
        self._last_write = _TornWrite(inode, offset, data)
        if crashing:
            raise SimulatedCrash(f"the process died in a write of {len(data)} bytes")
        return len(data)

    def _sync(self, inode: _Inode) -> None:
        inode.durable = bytes(inode.data)
        if self._last_write is not None and self._last_write.inode is inode:
            self._last_write = None
        self._charge_sync()

    def _name_inode_durable(self, inode: _Inode) -> None:
        for path, named in self._names.items():
            if named is inode and path not in self._durable_names:
                self._durable_names[path] = inode

    def _charge_sync(self) -> None:
        self.syncs += 1
        if self._sync_latency_ms is not None:
            self._sync_delay_ms += self._sync_latency_ms()
