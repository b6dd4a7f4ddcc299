"""An object store: a local directory or any filesystem ``pyarrow.fs`` knows (``s3://``,
``gs://``, ``hdfs://``, ``file://``), seen as paths relative to a root. Backups
(``waltz_engine.ops.backup``) and the storage node's tier (``waltz_engine.storage.tier``) write
through it.

Every write is atomic per file: the bytes go to a temporary object under the store's temporary
directory first, then move to their name (a rename locally; a copy, then a delete, on an object
store, where the copy appears whole or not at all). A writer killed at any point therefore
leaves each named file either as it was or as it meant it, plus temporary debris that the next
run removes.

Reads take a file's first ``size`` bytes: files only grow (records are appended, never
changed), so the prefix a manifest names stays what it was even when a later, unfinished run
made the file longer.
"""

from __future__ import annotations

import contextlib
import hashlib
import posixpath
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, BinaryIO

from waltz_engine.common.errors import WaltzError
from waltz_engine.common.extras import BACKUP, require
from waltz_engine.common.fileio import fsync_directory, fsync_file

if TYPE_CHECKING:
    import pyarrow.fs as pafs

# Temporary objects of a run in progress (debris once a run is killed), by default.
TMP_DIR = ".tmp"
# Bytes moved per read or write call when copying a file.
COPY_CHUNK_BYTES = 8 * 1024 * 1024


class ObjectStoreError(WaltzError):
    """The store cannot be reached or read as needed."""


@dataclass(frozen=True)
class FileEntry:
    """A file as a manifest names it: its size and the SHA-256 of that many first bytes."""

    size: int
    sha256: str


def _import_pyarrow(feature: str) -> tuple[ModuleType, ModuleType]:
    """pyarrow and pyarrow.fs, imported when a store is opened rather than when the CLI or a node
    starts (they are large, and an extra)."""
    require(BACKUP, feature, "pyarrow")
    import pyarrow
    import pyarrow.fs

    return pyarrow, pyarrow.fs


# The URL schemes pyarrow's ``FileSystem.from_uri`` opens; any other can never work.
STORE_URL_SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")


def url_scheme_problem(url: str) -> str | None:
    """Why ``url`` can never name a store (an unknown scheme), or None: checked at start, so a
    typo stops a node with one line instead of failing every later attempt."""
    if "://" not in url:
        return None  # a local path
    scheme = url.split("://", 1)[0].lower()
    if scheme in STORE_URL_SCHEMES:
        return None
    schemes = ", ".join(f"{known}://" for known in STORE_URL_SCHEMES)
    return f"unknown URL scheme '{scheme}://': give a local path or a {schemes} URL"


def _open_filesystem(url: str, pyarrow: ModuleType, fs_module: ModuleType) -> tuple[pafs.FileSystem, str]:
    if "://" not in url:
        return fs_module.LocalFileSystem(), str(Path(url).expanduser().resolve())
    try:
        fs, root = fs_module.FileSystem.from_uri(url)
    except (pyarrow.ArrowException, ValueError, OSError) as e:
        raise ObjectStoreError(
            f"{url}: not a location pyarrow can open ({e}); give a local path or an "
            "s3://, gs://, hdfs:// or file:// URL"
        ) from None
    return fs, root.rstrip("/")


class ObjectStore:
    """One store's root; every ``name`` below is a '/'-separated path relative to it.

    ``feature`` names what needs the store in the one line said when pyarrow is missing;
    ``tmp_dir`` is where this writer's temporary objects go (writers that share a root each
    need their own: :meth:`remove_debris` empties it).
    """

    def __init__(self, url: str, feature: str, tmp_dir: str = TMP_DIR) -> None:
        self.url = url
        self.tmp_dir = tmp_dir
        self._pyarrow, self._pafs = _import_pyarrow(feature)
        self.fs, self.root = _open_filesystem(url, self._pyarrow, self._pafs)
        # A local store is synced like a storage node's files: a published manifest must name
        # bytes that survive a power loss. Object stores make a completed upload durable.
        self._local = isinstance(self.fs, self._pafs.LocalFileSystem)

    def _path(self, name: str) -> str:
        return posixpath.join(self.root, name)

    def _step(self) -> None:
        """Called before each operation that changes the store (a hook for tests)."""

    def _call(self, what: str, name: str, action: Callable[[], object]) -> object:
        try:
            return action()
        except (self._pyarrow.ArrowException, OSError) as e:
            raise ObjectStoreError(f"{self.url}: cannot {what} {name}: {e}") from None

    # --- reading ---------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        info = self._call("look at", name, lambda: self.fs.get_file_info(self._path(name)))
        assert isinstance(info, self._pafs.FileInfo)
        return bool(info.type != self._pafs.FileType.NotFound)

    def read_bytes(self, name: str) -> bytes:
        def read() -> bytes:
            with self.fs.open_input_stream(self._path(name)) as f:
                return bytes(f.read())

        data = self._call("read", name, read)
        assert isinstance(data, bytes)
        return data

    def download(self, name: str, size: int, target: Path) -> str:
        """The file's first ``size`` bytes into ``target``; their SHA-256 (hex)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as out:
            return self._read_prefix(name, size, out.write)

    def download_to(self, name: str, size: int, sink: Callable[[bytes], None]) -> str:
        """The file's first ``size`` bytes, handed to ``sink`` a chunk at a time; their SHA-256."""
        return self._read_prefix(name, size, sink)

    def checksum(self, name: str, size: int) -> str:
        """SHA-256 (hex) of the file's first ``size`` bytes, read without keeping them."""
        return self._read_prefix(name, size, None)

    def _read_prefix(self, name: str, size: int, sink: Callable[[bytes], object] | None) -> str:
        def read() -> str:
            digest = hashlib.sha256()
            with self.fs.open_input_stream(self._path(name)) as source:
                left = size
                while left > 0:
                    chunk = bytes(source.read(min(COPY_CHUNK_BYTES, left)))
                    if not chunk:
                        raise ObjectStoreError(
                            f"{self.url}: {name} holds {size - left} bytes, the manifest names {size}"
                        )
                    digest.update(chunk)
                    if sink is not None:
                        sink(chunk)
                    left -= len(chunk)
            return digest.hexdigest()

        result = self._call("read", name, read)
        assert isinstance(result, str)
        return result

    def copy_range(self, name: str, offset: int, size: int, out: BinaryIO) -> None:
        """Bytes ``offset..offset+size`` of the file into ``out`` at its position, a chunk at a
        time (a ranged read: a reader of part of a large object fetches only that part)."""

        def copy() -> None:
            with self.fs.open_input_file(self._path(name)) as source:
                done = 0
                while done < size:
                    chunk = bytes(source.read_at(min(COPY_CHUNK_BYTES, size - done), offset + done))
                    if not chunk:
                        raise ObjectStoreError(
                            f"{self.url}: {name} ends at {offset + done} bytes, {offset + size} expected"
                        )
                    out.write(chunk)
                    done += len(chunk)

        self._call("read", name, copy)

    def list_names(self, directory: str = "", files_only: bool = True) -> list[str]:
        """The names directly in ``directory`` (the root by default)."""
        path = self._path(directory) if directory else self.root
        selector = self._pafs.FileSelector(path, allow_not_found=True, recursive=False)
        found = self._call("list", directory or self.url, lambda: self.fs.get_file_info(selector))
        assert isinstance(found, list)
        return sorted(
            posixpath.basename(f.path) for f in found if not files_only or f.type == self._pafs.FileType.File
        )

    # --- writing (each atomic per file) -----------------------------------------------------

    def _temporary(self) -> str:
        return posixpath.join(self.tmp_dir, uuid.uuid4().hex)

    def _ensure_parent(self, name: str) -> None:
        parent = posixpath.dirname(self._path(name))
        self._call("create", parent, lambda: self.fs.create_dir(parent, recursive=True))

    def _move_in(self, temporary: str, name: str) -> None:
        self._ensure_parent(name)
        self._step()
        self._call("write", name, lambda: self.fs.move(self._path(temporary), self._path(name)))
        if self._local:
            fsync_directory(Path(self._path(name)).parent)

    def _sync(self, temporary: str) -> None:
        if self._local:
            fsync_file(Path(self._path(temporary)))

    def write_bytes(self, name: str, data: bytes) -> None:
        temporary = self._temporary()
        self._ensure_parent(temporary)
        self._step()

        def write() -> None:
            with self.fs.open_output_stream(self._path(temporary)) as out:
                out.write(data)

        self._call("write", temporary, write)
        self._sync(temporary)
        self._move_in(temporary, name)

    def upload(
        self,
        source: Path,
        name: str,
        chunk_bytes: int = COPY_CHUNK_BYTES,
        throttle: Callable[[int], None] | None = None,
    ) -> int:
        """Copy a local file to ``name``; the bytes copied. ``throttle`` is told each chunk's size
        once it is written (a rate limit sleeps there)."""

        def chunks() -> Iterator[bytes]:
            with source.open("rb") as f:
                while chunk := f.read(chunk_bytes):
                    yield chunk

        return self.upload_chunks(chunks(), name, throttle)

    def upload_chunks(
        self, chunks: Iterable[bytes], name: str, throttle: Callable[[int], None] | None = None
    ) -> int:
        """Write ``chunks`` to ``name``; the bytes written (see :meth:`upload`)."""
        temporary = self._temporary()
        self._ensure_parent(temporary)
        self._step()

        def write() -> int:
            copied = 0
            with self.fs.open_output_stream(self._path(temporary)) as out:
                for chunk in chunks:
                    out.write(chunk)
                    copied += len(chunk)
                    if throttle is not None:
                        throttle(len(chunk))
            return copied

        copied = self._call("write", temporary, write)
        assert isinstance(copied, int)
        self._sync(temporary)
        self._move_in(temporary, name)
        return copied

    def delete(self, name: str) -> None:
        """Remove a file; one already gone is no error (a removal resumed after a kill)."""
        self._step()

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.delete_file(self._path(name))

        self._call("delete", name, remove)

    def remove_debris(self) -> None:
        """Remove what killed runs left in the temporary directory (nothing a manifest names is
        there)."""
        path = self._path(self.tmp_dir)
        self._step()
        self._call("clean", self.tmp_dir, lambda: self.fs.delete_dir_contents(path, missing_dir_ok=True))


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(COPY_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
