"""A run of a segment's records handled by columns, never one Python object per record (§1.4).

Shared by the storage node (a RECORD_LIST answer served from the segment's bytes,
:mod:`waltz_engine.storage.wire_span`) and Spark (:mod:`spark.segments`, :mod:`spark.network`).

* :func:`chunk_crcs_match`: every record's CRC32 checked by one ``zlib.crc32`` over the run.
* :func:`disk_to_wire`: a run of whole records checked (txids, lengths, record CRCs, data
  checksums) and turned from the disk layout ``txid, reqId, header, dataLength, dataChecksum,
  data, CRC`` into the wire layout of a record list ``txid, reqId, header, dataLength, data,
  dataChecksum`` (the original's ``Record.writeTo``): the 32 leading bytes are the same, the
  checksum moves behind the data and the CRC goes.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

from waltz_engine.disk.record_format import (
    RECORD_CRC_UNSIGNED,
    RECORD_HEADER,
    RECORD_HEADER_SIZE_BYTES,
    RECORD_OVERHEAD_BYTES,
)

CRC_SIZE_BYTES = RECORD_OVERHEAD_BYTES - RECORD_HEADER_SIZE_BYTES
# XORed into a record's stored CRC and written back little-endian, it makes the CRC32 of the
# record (header, data, that field) zero, which is CRC32's initial state: so a run of valid
# records so rewritten has a CRC32 of zero as a whole (:func:`chunk_crcs_match`).
# Found by solving the 32 linear equations over GF(2) (tests/spark/test_spark_segments.py).
CRC_ZEROING_MASK = 0x6DD90A9D
# A record header as stored: the ReqId halves split into their int32 parts (clientId,
# generation | partitionId, seqNum), all big-endian; itemsize is exactly the 36 header bytes.
# The fields a record's disk and wire layouts both start with (txid, reqId, header, dataLength).
SHARED_HEAD_FIELDS: list[tuple[str, str]] = [
    ("transaction_id", ">i8"),
    ("client_id", ">i4"),
    ("generation", ">i4"),
    ("partition_id", ">i4"),
    ("seq_num", ">i4"),
    ("header", ">i4"),
    ("length", ">i4"),
]
HEADER_DTYPE = np.dtype([*SHARED_HEAD_FIELDS, ("checksum", ">i4")])
assert HEADER_DTYPE.itemsize == RECORD_HEADER_SIZE_BYTES
CRC_DTYPE = np.dtype(">u4")
# Bytes a record's disk and wire layouts share at its start: txid, reqId, header, dataLength.
SHARED_PREFIX_BYTES: int = HEADER_DTYPE.fields["checksum"][1]  # type: ignore[index]  # a structured dtype has fields
# A record is this much shorter on the wire than on disk (no CRC).
WIRE_SAVING_BYTES = CRC_SIZE_BYTES
_ZERO_PREFIX = bytes(SHARED_PREFIX_BYTES)
# Written over the data checksum's place after a zeroed prefix, it brings the CRC register back
# to its initial state: the data then follows as if it were a run of its own (data checks).
_REGISTER_RESET = ((zlib.crc32(_ZERO_PREFIX) ^ CRC_ZEROING_MASK) & 0xFFFFFFFF).to_bytes(4, "little")
assert zlib.crc32(_ZERO_PREFIX + _REGISTER_RESET) == 0
_FIELD = np.arange(CRC_SIZE_BYTES, dtype=np.int64)
CRC_BITS = 32
# Record data sizes whose CRC tables (8 KiB each) are kept (:func:`_unshift_tables`).
UNSHIFT_TABLES_CACHED = 64
# Runs of at most this many records are checked and converted record by record (a few C calls
# each): numpy's fixed cost per call outweighs its gain below that (a consumer at the tail reads
# one record; 1 KiB segments hold a few).
SMALL_RUN_MAX_RECORDS = 32
# Records of one size in a run from which their data checksums are checked by linearity
# (:func:`_data_checksums_ok`): a size's tables cost 33 CRC passes over that much data, paid
# back many times over from this many records on, even when every run has a new size.
LINEAR_CHECK_MIN_RECORDS = 256


def chunk_crcs_match(buf: bytes | memoryview, record_offsets: np.ndarray, stored_crcs: np.ndarray) -> bool:
    """Whether every record tiling ``buf[record_offsets[0]:record_offsets[-1]]`` (each ending in
    its 4-byte CRC32, big-endian as Java writes it) has the CRC32 of its header and data.

    CRC32 is affine over GF(2): replacing each record's stored CRC ``c`` by
    ``le32(c ^ CRC_ZEROING_MASK)`` brings the CRC register back to its initial state after
    every valid record, so the CRC32 of the rewritten run is zero. One C call over the chunk
    replaces a call per record (3x faster for 100-byte records). The check is as strong as
    CRC32 itself over the chunk: damage it misses is damage whose error polynomial the CRC
    polynomial divides, a 2^-32 chance for random damage, as for one record's check."""
    start, end = int(record_offsets[0]), int(record_offsets[-1])
    work = np.frombuffer(buf, dtype=np.uint8, count=end - start, offset=start).copy()
    crc_starts = record_offsets[1:] - CRC_SIZE_BYTES - start
    return _zeroed_crc_ok(work, crc_starts, stored_crcs)


def _zeroed_crc_ok(work: np.ndarray, field_starts: np.ndarray, values: np.ndarray) -> bool:
    """Write ``le32(value ^ CRC_ZEROING_MASK)`` at each field start of ``work``, then whether
    the CRC32 of the whole of ``work`` is zero."""
    fields = (values ^ np.uint32(CRC_ZEROING_MASK)).astype("<u4").view(np.uint8).reshape(-1, CRC_SIZE_BYTES)
    for j in range(CRC_SIZE_BYTES):
        work[field_starts + j] = fields[:, j]
    return zlib.crc32(work.data) == 0


def zeroed_crcs_ok(rows: np.ndarray, stored_crcs: np.ndarray) -> bool:
    """:func:`chunk_crcs_match` of records of one size, one a row of ``rows`` (a contiguous
    uint8 matrix the check may overwrite, each row ending in its CRC's place): the CRCs are
    written over those places by one strided copy."""
    fields = (stored_crcs ^ np.uint32(CRC_ZEROING_MASK)).astype("<u4").view(np.uint8)
    rows[:, -CRC_SIZE_BYTES:] = fields.reshape(-1, CRC_SIZE_BYTES)
    return zlib.crc32(rows.data) == 0


@functools.lru_cache(maxsize=UNSHIFT_TABLES_CACHED)
def _unshift_tables(data_bytes: int) -> np.ndarray:
    """Four 256-entry tables (one per byte of a value) of the inverse of ``S``, the GF(2)-linear
    map with ``crc32(a + b) == S(crc32(a)) ^ crc32(b)`` for every ``b`` of ``data_bytes`` bytes
    (zlib's ``crc32_combine``): ``S(x) == crc32(zeros, x) ^ crc32(zeros)``."""
    zeros = bytes(data_bytes)
    base = zlib.crc32(zeros)
    # Gauss-Jordan over GF(2) on rows (S(x), x): once each S(x) is a single bit, x is S^-1(bit).
    rows = [(zlib.crc32(zeros, 1 << i) ^ base, 1 << i) for i in range(CRC_BITS)]
    for position, bit in enumerate(reversed(range(CRC_BITS))):
        pivot = next(k for k in range(position, CRC_BITS) if rows[k][0] >> bit & 1)  # S is invertible
        rows[position], rows[pivot] = rows[pivot], rows[position]
        image, preimage = rows[position]
        rows = [
            (i ^ image, p ^ preimage) if k != position and i >> bit & 1 else (i, p)
            for k, (i, p) in enumerate(rows)
        ]
    tables = np.zeros((CRC_BITS // 8, 256), dtype=np.uint32)
    byte_values = np.arange(256)
    for image, preimage in rows:
        bit = image.bit_length() - 1
        assert image == 1 << bit
        tables[bit // 8, (byte_values >> bit % 8) & 1 == 1] ^= np.uint32(preimage)
    return tables


def unshift_crcs(data_bytes: int, values: np.ndarray) -> np.ndarray:
    """``S^-1`` (see :func:`_unshift_tables`) of each uint32 of ``values``."""
    tables = _unshift_tables(data_bytes)
    result: np.ndarray = tables[0][values & 0xFF]
    for byte in range(1, CRC_BITS // 8):
        result ^= tables[byte][(values >> np.uint32(8 * byte)) & 0xFF]
    return result


def _data_checksums_ok(matrix: np.ndarray, crcs: np.ndarray, checksums: np.ndarray, data_bytes: int) -> bool:
    """Whether every record (a row of ``matrix``, ``data_bytes`` of data each) has the data
    checksum it stores, given that each has its CRC (checked before).

    ``crc == S(crc32(head)) ^ crc32(data)`` (``head`` the 36 header bytes, the stored data
    checksum ``d`` among them), so ``crc32(data) == d`` exactly when ``crc32(head) ==
    S^-1(crc ^ d)``: a CRC pass over the heads (40 bytes a record with that value) instead of
    a second one over the whole records."""
    heads = np.empty((len(crcs), RECORD_HEADER_SIZE_BYTES + CRC_SIZE_BYTES), dtype=np.uint8)
    heads[:, :RECORD_HEADER_SIZE_BYTES] = matrix[:, :RECORD_HEADER_SIZE_BYTES]
    expected = unshift_crcs(data_bytes, crcs.astype(np.uint32) ^ checksums.astype(np.uint32))
    return zeroed_crcs_ok(heads, expected)


def _columns(starts: np.ndarray, first: int, stop: int) -> np.ndarray:
    """The byte positions ``start + first .. start + stop`` of every record, row by row."""
    return (starts[:, None] + np.arange(first, stop, dtype=np.int64)).ravel()


def disk_to_wire(buf: bytes, record_offsets: np.ndarray | list[int], first_txid: int) -> np.ndarray | None:
    """The wire layout of the whole records tiling ``buf`` from ``record_offsets[0] == 0`` to
    ``record_offsets[-1]`` (each record ends where the next starts), as uint8s; None unless
    every record is whole and has txid ``first_txid + k``, a data length that fills it, its
    CRC32 and its data checksum. The caller then reads them one at a time, which names the
    bad record."""
    n = len(record_offsets) - 1
    end = int(record_offsets[-1])
    if n <= 0 or int(record_offsets[0]) != 0 or end > len(buf):
        return None
    if n <= SMALL_RUN_MAX_RECORDS:
        offsets = record_offsets if isinstance(record_offsets, list) else record_offsets.tolist()
        return _small_disk_to_wire(buf, offsets, first_txid)
    record_offsets = np.asarray(record_offsets, dtype=np.int64)
    sizes = np.diff(record_offsets)
    if bool((sizes < RECORD_OVERHEAD_BYTES).any()):
        return None
    disk = np.frombuffer(buf, dtype=np.uint8, count=end)
    starts = record_offsets[:-1]
    size = int(sizes[0])
    # Records of one size (the usual case) are a matrix: every step is a strided copy.
    matrix = disk.reshape(n, size) if bool((sizes == size).all()) else None
    if matrix is not None:
        # Strided views of the fields, no copy.
        def field(name: str) -> np.ndarray:
            dtype, offset = HEADER_DTYPE.fields[name][:2]  # type: ignore[index]  # a structured dtype has fields
            return np.ndarray((n,), dtype=dtype, buffer=disk, offset=offset, strides=(size,))

        txids, lengths, checksums = field("transaction_id"), field("length"), field("checksum")
        crcs = np.ndarray((n,), dtype=CRC_DTYPE, buffer=disk, offset=size - CRC_SIZE_BYTES, strides=(size,))
    else:
        heads = disk[_columns(starts, 0, RECORD_HEADER_SIZE_BYTES)].view(HEADER_DTYPE)
        txids, lengths, checksums = heads["transaction_id"], heads["length"], heads["checksum"]
        crcs = disk[_columns(record_offsets[1:], -CRC_SIZE_BYTES, 0)].view(CRC_DTYPE)
    if not (
        np.array_equal(txids, np.arange(first_txid, first_txid + n, dtype=np.int64))
        and np.array_equal(lengths, sizes - RECORD_OVERHEAD_BYTES)
    ):
        return None
    if matrix is not None and n >= LINEAR_CHECK_MIN_RECORDS:
        if not zeroed_crcs_ok(matrix.copy(), crcs):
            return None
        if not _data_checksums_ok(matrix, crcs, checksums, size - RECORD_OVERHEAD_BYTES):
            return None
    else:
        work = disk.copy()
        crc_starts = record_offsets[1:] - CRC_SIZE_BYTES
        if not _zeroed_crc_ok(work, crc_starts, crcs):
            return None
        # The data checks, in the same copy: each record's prefix zeroed and followed by the
        # bytes that reset the register, its CRC's place given its data checksum (masked).
        work[_columns(starts, 0, SHARED_PREFIX_BYTES)] = 0
        work[_columns(starts, SHARED_PREFIX_BYTES, RECORD_HEADER_SIZE_BYTES)] = np.tile(
            np.frombuffer(_REGISTER_RESET, np.uint8), n
        )
        if not _zeroed_crc_ok(work, crc_starts, checksums.astype(np.uint32)):
            return None
    if matrix is not None:
        wire = np.empty((n, size - WIRE_SAVING_BYTES), dtype=np.uint8)
        data_end = size - CRC_SIZE_BYTES  # in the disk layout; on the wire the checksum ends there
        wire_data_end = data_end - CRC_SIZE_BYTES
        wire[:, :SHARED_PREFIX_BYTES] = matrix[:, :SHARED_PREFIX_BYTES]
        wire[:, SHARED_PREFIX_BYTES:wire_data_end] = matrix[:, RECORD_HEADER_SIZE_BYTES:data_end]
        wire[:, wire_data_end:] = matrix[:, SHARED_PREFIX_BYTES:RECORD_HEADER_SIZE_BYTES]
        return wire.ravel()
    # Each checksum copied over its record's CRC, then the checksum's own place dropped.
    moved = disk.copy()
    checksum_places = _columns(starts, SHARED_PREFIX_BYTES, RECORD_HEADER_SIZE_BYTES)
    moved[_columns(record_offsets[1:], -CRC_SIZE_BYTES, 0)] = disk[checksum_places]
    keep = np.ones(end, dtype=np.bool_)
    keep[checksum_places] = False
    return moved[keep]


def _small_disk_to_wire(buf: bytes, offsets: list[int], first_txid: int) -> np.ndarray | None:
    """:func:`disk_to_wire` of a short run, one record at a time: each record's CRC32 and data
    checksum by ``zlib.crc32`` over its own bytes (as the exact reader checks them)."""
    view = memoryview(buf)
    wire = bytearray()
    for k in range(len(offsets) - 1):
        start, stop = offsets[k], offsets[k + 1]
        if stop - start < RECORD_OVERHEAD_BYTES:
            return None
        txid, _, _, _, length, checksum = RECORD_HEADER.unpack_from(buf, start)
        data_start, crc_start = start + RECORD_HEADER_SIZE_BYTES, stop - CRC_SIZE_BYTES
        if txid != first_txid + k or length != crc_start - data_start:
            return None
        if zlib.crc32(view[start:crc_start]) != RECORD_CRC_UNSIGNED.unpack_from(buf, crc_start)[0]:
            return None
        if zlib.crc32(view[data_start:crc_start]) != checksum & 0xFFFFFFFF:
            return None
        wire += view[start : start + SHARED_PREFIX_BYTES]
        wire += view[data_start:crc_start]
        wire += view[start + SHARED_PREFIX_BYTES : data_start]
    return np.frombuffer(wire, dtype=np.uint8)
