"""`waltz bench crc`: CRC-32 throughput of zlib.crc32 against crcmod's C extension."""

from __future__ import annotations

import importlib
import os
import timeit
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import crcmod.predefined

INPUT_SIZES_BYTES = (100, 1024, 64 * 1024)
# timeit's autorange sizes one timing to at least 0.2 s; the best of REPEATS is kept.
REPEATS = 5
BYTES_PER_MB = 1_000_000


@dataclass(frozen=True)
class CrcResult:
    implementation: str
    input_bytes: int
    ns_per_call: float

    @property
    def mb_per_s(self) -> float:
        return self.input_bytes / self.ns_per_call * 1e9 / BYTES_PER_MB

    def to_json(self) -> dict[str, Any]:
        return {
            "implementation": self.implementation,
            "input_bytes": self.input_bytes,
            "ns_per_call": round(self.ns_per_call, 1),
            "mb_per_s": round(self.mb_per_s, 1),
        }


def crcmod_uses_c_extension() -> bool:
    # The package re-exports the `crcmod.crcmod` module's names, which hides the module itself.
    return bool(getattr(importlib.import_module("crcmod.crcmod"), "_usingExtension", False))


def _time_ns_per_call(func: Callable[[bytes], int], data: bytes) -> float:
    timer = timeit.Timer(lambda: func(data))
    calls, _ = timer.autorange()
    best_s = min(timer.repeat(repeat=REPEATS, number=calls))
    return best_s / calls * 1e9


def run() -> list[CrcResult]:
    crcmod_crc32 = crcmod.predefined.mkCrcFun("crc-32")
    implementations: dict[str, Callable[[bytes], int]] = {
        "zlib.crc32": zlib.crc32,
        "crcmod crc-32": crcmod_crc32,
    }
    results = []
    for size in INPUT_SIZES_BYTES:
        data = os.urandom(size)
        assert zlib.crc32(data) == crcmod_crc32(data), "both must compute Java's CRC32"
        for name, func in implementations.items():
            results.append(CrcResult(name, size, _time_ns_per_call(func, data)))
    return results
