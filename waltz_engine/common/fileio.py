"""Positional reads and writes on open files that never stop half way silently, and fsyncs of
files and directories by path.

:class:`DiskFile` is what the storage engine's file system seam opens
(waltz_engine/storage/file_system.py): a real descriptor, or a simulated disk's file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

Bytes = bytes | bytearray | memoryview


class DiskFile(Protocol):
    """An open file, read and written at explicit offsets."""

    def pread(self, size_bytes: int, offset: int) -> bytes: ...

    def pwrite(self, data: Bytes, offset: int) -> int: ...

    def size_bytes(self) -> int: ...

    def truncate(self, size_bytes: int) -> None: ...

    def fsync(self) -> None: ...

    def fdatasync(self) -> None: ...

    def close(self) -> None: ...


def pwrite_all(file: DiskFile, data: Bytes, offset: int) -> None:
    """Write all of ``data`` at ``offset``; a regular file may accept a write in parts."""
    if not data:
        return
    written = file.pwrite(data, offset)
    if written == len(data):
        return  # (the usual case: taken whole, no view)
    assert written > 0, "pwrite wrote nothing"
    view = memoryview(data)[written:]
    offset += written
    while view:
        written = file.pwrite(view, offset)
        assert written > 0, "pwrite wrote nothing"
        view = view[written:]
        offset += written


def pread_upto(file: DiskFile, size_bytes: int, offset: int) -> bytes:
    """Read ``size_bytes`` at ``offset``, fewer only at end of file."""
    chunks: list[bytes] = []
    remaining = size_bytes
    while remaining > 0:
        chunk = file.pread(remaining, offset)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
        offset += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def fsync_directory(directory: Path) -> None:
    """Make created or deleted names in ``directory`` durable, not only the files' contents."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Make a file's written contents durable (one written through a library that does not)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
