"""Positional reads and writes on raw file descriptors that never stop half way silently, and
fsyncs of files and directories by path."""

from __future__ import annotations

import os
from pathlib import Path


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset``; a regular file may accept a write in parts."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        assert written > 0, "pwrite wrote nothing"
        view = view[written:]
        offset += written


def pread_upto(fd: int, size_bytes: int, offset: int) -> bytes:
    """Read ``size_bytes`` at ``offset``, fewer only at end of file."""
    chunks: list[bytes] = []
    remaining = size_bytes
    while remaining > 0:
        chunk = os.pread(fd, remaining, offset)
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
