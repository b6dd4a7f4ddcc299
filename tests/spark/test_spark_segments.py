"""The chunk-wide CRC check of the segment parser (record_columns.chunk_crcs_match) against the
record-by-record definition: every record's CRC32 over its header and data."""

from __future__ import annotations

import os
import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_engine.disk.record_columns import CRC_ZEROING_MASK, chunk_crcs_match

CRC_BYTES = 4


def zeroing_mask(message: bytes) -> int:
    """Solve, over GF(2), for the 4 bytes v that make crc32(message + le32(v)) zero; the mask is
    v ^ crc32(message). CRC32 is affine in v, so 32 probes and an elimination suffice."""
    base = zlib.crc32(message + bytes(CRC_BYTES))
    basis: dict[int, tuple[int, int]] = {}  # pivot bit -> (column, the unit bits it combines)
    for bit in range(32):
        column = zlib.crc32(message + (1 << bit).to_bytes(CRC_BYTES, "little")) ^ base
        combination = 1 << bit
        for pivot in sorted(basis, reverse=True):
            if column >> pivot & 1:
                column ^= basis[pivot][0]
                combination ^= basis[pivot][1]
        if column:
            basis[column.bit_length() - 1] = (column, combination)
    target, solution = base, 0
    for pivot in sorted(basis, reverse=True):
        if target >> pivot & 1:
            target ^= basis[pivot][0]
            solution ^= basis[pivot][1]
    assert target == 0, "no solution: CRC32 would not be invertible in its last 4 bytes"
    assert zlib.crc32(message + solution.to_bytes(CRC_BYTES, "little")) == 0
    return solution ^ zlib.crc32(message)


def test_the_zeroing_mask_is_the_same_for_every_message() -> None:
    for size in (0, 1, 7, 36, 136, 4096):
        assert zeroing_mask(os.urandom(size)) == CRC_ZEROING_MASK


def chunk(payloads: list[bytes], prefix: bytes = b"") -> tuple[bytearray, np.ndarray, np.ndarray]:
    """Records (payload + its CRC32, big-endian) after ``prefix``; their offsets and CRCs."""
    buf = bytearray(prefix)
    offsets = [len(buf)]
    for payload in payloads:
        buf += payload + zlib.crc32(payload).to_bytes(CRC_BYTES, "big")
        offsets.append(len(buf))
    buf += b"trailing bytes past the last record are not checked"
    crcs = np.array([zlib.crc32(p) for p in payloads], dtype=np.uint32)
    return buf, np.array(offsets, dtype=np.int64), crcs


def stored_crcs(buf: bytearray, offsets: np.ndarray) -> np.ndarray:
    """The CRC fields as a reader finds them (after any damage)."""
    return np.array(
        [int.from_bytes(buf[end - CRC_BYTES : end], "big") for end in offsets[1:].tolist()], dtype=np.uint32
    )


payload_lists = st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(payloads=payload_lists, prefix=st.binary(max_size=20))
def test_valid_records_pass(payloads: list[bytes], prefix: bytes) -> None:
    buf, offsets, crcs = chunk(payloads, prefix)
    assert chunk_crcs_match(bytes(buf), offsets, crcs)


@settings(max_examples=300, deadline=None)
@given(payloads=payload_lists, data=st.data())
def test_any_flipped_bit_of_any_record_fails(payloads: list[bytes], data: st.DataObject) -> None:
    buf, offsets, _ = chunk(payloads)
    position = data.draw(st.integers(0, int(offsets[-1]) - 1))
    buf[position] ^= 1 << data.draw(st.integers(0, 7))
    # Single-bit errors are always caught by CRC32, whichever record (or CRC field) they hit.
    assert not chunk_crcs_match(bytes(buf), offsets, stored_crcs(buf, offsets))


@settings(max_examples=300, deadline=None)
@given(payloads=payload_lists, data=st.data())
def test_agrees_with_the_record_by_record_check(payloads: list[bytes], data: st.DataObject) -> None:
    buf, offsets, _ = chunk(payloads)
    for _ in range(data.draw(st.integers(0, 3))):  # overwrite a few bytes, maybe none
        position = data.draw(st.integers(0, int(offsets[-1]) - 1))
        buf[position] = data.draw(st.integers(0, 255))
    crcs = stored_crcs(buf, offsets)
    each_ok = all(
        zlib.crc32(buf[start : end - CRC_BYTES]) == int(crc)
        for start, end, crc in zip(offsets[:-1].tolist(), offsets[1:].tolist(), crcs.tolist(), strict=True)
    )
    assert chunk_crcs_match(bytes(buf), offsets, crcs) == each_ok
