"""What a node's listening ports admit (reference: none; our limits): open connections per node
and per peer address, the time from accept to the Hello, the bytes buffered per connection
(:class:`ConnectionLimits`, config keys on both node kinds), and the gate that counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging
from dataclasses import dataclass
from typing import Any

from waltz_engine.common.config import Config, ConfigError
from waltz_engine.common.limited_log import LIMITED_LOG_INTERVAL_S, LimitedLog
from waltz_engine.wire.frame import FRAME_HEADER_SIZE_BYTES, MAX_FRAME_SIZE_BYTES

log = logging.getLogger("waltz_engine.net.channel")

HANDSHAKE_TIMEOUT_MS = 10_000
# What a listening port admits (each a config key on both node kinds, see ConnectionLimits):
# open connections per node (all its ports) and per peer address; beyond them a new
# connection is closed at once.
MAX_CONNECTIONS = 10_000
MAX_CONNECTIONS_PER_PEER = 1_000
# Bytes read from a peer and not yet taken by the handler; a frame may not be larger.
MAX_BUFFERED_BYTES_PER_CONNECTION = MAX_FRAME_SIZE_BYTES + FRAME_HEADER_SIZE_BYTES
# A refused peer is named in the log at most once per interval (with how many were refused).
REFUSAL_LOG_INTERVAL_S = LIMITED_LOG_INTERVAL_S
# Once this many connections were open at once, half of them have closed and none for a
# moment, the allocator is asked to give its free memory back (glibc keeps the pages of freed
# TLS state, and the process would stay at its peak).
RELEASE_MEMORY_AFTER_CONNECTIONS = 256
RELEASE_MEMORY_QUIET_S = 1.0


_malloc_trim: Any = None


@dataclass(frozen=True)
class ConnectionLimits:
    """What one node's listening ports admit; the storage.* and server.* connection keys."""

    # From accept to the Hello exchanged (TLS handshake included); then the connection is closed.
    handshake_timeout_ms: int = HANDSHAKE_TIMEOUT_MS
    # Open connections of the node, on all its ports together.
    max_connections: int = MAX_CONNECTIONS
    # Open connections from one peer address.
    max_connections_per_peer: int = MAX_CONNECTIONS_PER_PEER
    # Bytes read and not yet taken by the handler; above it the socket is not read (a frame
    # larger than this, less its header, is a protocol error).
    max_buffered_bytes: int = MAX_BUFFERED_BYTES_PER_CONNECTION

    def check(self) -> None:
        """Raises ValueError naming the field that is out of range."""
        for field in ("handshake_timeout_ms", "max_connections", "max_connections_per_peer"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)}")
        if self.max_buffered_bytes <= FRAME_HEADER_SIZE_BYTES:
            raise ValueError(
                f"max_buffered_bytes must exceed a frame header ({FRAME_HEADER_SIZE_BYTES} bytes), "
                f"got {self.max_buffered_bytes}"
            )


def read_connection_limits(
    config: Config, handshake_timeout: str, max_connections: str, per_peer: str, buffered: str
) -> ConnectionLimits:
    """A node's :class:`ConnectionLimits` from its four keys (each positive; defaults as channel's)."""

    def positive(key: str, default: int) -> int:
        return config.get_positive(key, default, long=True)

    limits = ConnectionLimits(
        handshake_timeout_ms=positive(handshake_timeout, HANDSHAKE_TIMEOUT_MS),
        max_connections=positive(max_connections, MAX_CONNECTIONS),
        max_connections_per_peer=positive(per_peer, MAX_CONNECTIONS_PER_PEER),
        max_buffered_bytes=positive(buffered, MAX_BUFFERED_BYTES_PER_CONNECTION),
    )
    try:
        limits.check()
    except ValueError as e:
        raise ConfigError(f"{config.source}: key '{buffered}': {e}") from None
    return limits


class ConnectionGate:
    """The open connections of one node by peer address; one gate for all the node's ports.

    :meth:`admit` refuses a connection beyond :class:`ConnectionLimits`; a refused peer is
    logged at most once per :data:`REFUSAL_LOG_INTERVAL_S`, with the count refused meanwhile
    (so are connections that close or time out before sending a byte).
    """

    def __init__(self, limits: ConnectionLimits | None = None) -> None:
        self.limits = limits if limits is not None else ConnectionLimits()
        self.limits.check()
        self.open = 0
        self.refused = 0
        self._peak = 0
        self._release_memory: asyncio.TimerHandle | None = None
        self._by_peer: dict[str, int] = {}
        self._limited_log = LimitedLog(log, REFUSAL_LOG_INTERVAL_S)

    def admit(self, address: str, name: str) -> bool:
        limits = self.limits
        from_peer = self._by_peer.get(address, 0)
        if self.open >= limits.max_connections:
            reason = f"the node has {self.open} open connections (limit {limits.max_connections})"
        elif from_peer >= limits.max_connections_per_peer:
            reason = f"{from_peer} open connections from it (limit {limits.max_connections_per_peer})"
        else:
            self.open += 1
            self._peak = max(self._peak, self.open)
            self._by_peer[address] = from_peer + 1
            return True
        self.refused += 1
        self.warn_limited(address, f"{name}: refused connections from {address}: {reason}")
        return False

    def release(self, address: str) -> None:
        self.open -= 1
        left = self._by_peer[address] - 1
        if left:
            self._by_peer[address] = left
        else:
            del self._by_peer[address]
        if self._peak >= RELEASE_MEMORY_AFTER_CONNECTIONS and self.open <= self._peak // 2:
            if self._release_memory is not None:
                self._release_memory.cancel()
            self._release_memory = asyncio.get_running_loop().call_later(
                RELEASE_MEMORY_QUIET_S, self._after_flood
            )

    def _after_flood(self) -> None:
        self._release_memory = None
        self._peak = self.open
        # A failed handshake leaves its TLS state in reference cycles (the error, its
        # traceback, the transport): collected first, or there is little to give back.
        gc.collect()
        release_free_memory()

    def warn_limited(self, key: str, message: str) -> None:
        self._limited_log.warn(key, message)


def release_free_memory() -> None:
    """glibc's ``malloc_trim(0)``: free heap pages back to the system (a no-op elsewhere).

    Connections' TLS state is many small and mid-sized blocks; when a flood of them closes,
    glibc keeps the freed pages in its heaps (the process stays at its peak RSS) until asked.
    """
    global _malloc_trim
    if _malloc_trim is None:
        _malloc_trim = False
        with contextlib.suppress(OSError, AttributeError, TypeError):
            _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    if _malloc_trim:
        _malloc_trim(0)
