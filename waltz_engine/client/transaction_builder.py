"""What ``TransactionContext.execute`` fills in (the original's ``TransactionBuilderImpl``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, Protocol, TypeVar

from waltz_engine.common.crc import crc32
from waltz_engine.common.lock_hash import partition_local_lock_hash
from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.client_messages import AppendRequest

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)

DEFAULT_HEADER = 0
# Builds a named tuple from its fields' tuple without its generated __new__'s Python call.
_new_tuple = tuple.__new__
EMPTY_DATA = b""


class Serializer(Protocol[T]):
    def serialize(self, value: T) -> bytes: ...

    def deserialize(self, data: bytes) -> T: ...


class PartitionLocalLock(NamedTuple):
    """A lock the server knows only by its hash, as the original's ``PartitionLocalLock``."""

    name: str
    id: int

    def hash(self) -> int:
        return partition_local_lock_hash(self.name, self.id)


LockLike = PartitionLocalLock | tuple[str, int]


def _hashes(locks: Iterable[LockLike]) -> tuple[int, ...]:
    return tuple(partition_local_lock_hash(name, lock_id) for name, lock_id in locks)


class TransactionBuilder:
    """One attempt's header, data and locks; ``build_request`` turns it into an APPEND_REQUEST."""

    __slots__ = ("req_id", "client_high_water_mark", "_header", "_data", "_write", "_read", "_append")

    def __init__(self, req_id: ReqId, client_high_water_mark: int) -> None:
        self.req_id = req_id
        self.client_high_water_mark = client_high_water_mark
        self._header = DEFAULT_HEADER
        self._data = EMPTY_DATA
        self._write: tuple[int, ...] = ()
        self._read: tuple[int, ...] = ()
        self._append: tuple[int, ...] = ()

    def set_header(self, header: int) -> None:
        assert -(1 << 31) <= header < (1 << 31), f"header must be an int32, got {header}"
        self._header = header

    def set_transaction_data(self, data: T | bytes, serializer: Serializer[T] | None = None) -> None:
        """``data`` as bytes, or any value with the serializer that turns it into bytes."""
        if serializer is not None:
            self._data = serializer.serialize(data)  # type: ignore[arg-type]
        elif isinstance(data, (bytes, bytearray, memoryview)):
            self._data = bytes(data)
        else:
            raise TypeError(f"transaction data of type {type(data).__name__} needs a serializer")

    def set_write_locks(self, locks: Iterable[LockLike]) -> None:
        self._write = _hashes(locks)

    def set_read_locks(self, locks: Iterable[LockLike]) -> None:
        self._read = _hashes(locks)

    def set_append_locks(self, locks: Iterable[LockLike]) -> None:
        self._append = _hashes(locks)

    def build_request(self) -> AppendRequest:
        data = self._data
        # tuple.__new__: the same AppendRequest without its generated __new__'s Python call.
        return _new_tuple(
            AppendRequest,
            (
                self.req_id,
                self.client_high_water_mark,
                self._write,
                self._read,
                self._append,
                self._header,
                data,
                crc32(data),
            ),
        )
