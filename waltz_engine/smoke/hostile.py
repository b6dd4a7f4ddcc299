"""The smoke test's hostile faults: what a rogue peer does to a live node.

* forged frames: a TLS client that knows the cluster key sends, on every partition, the
  requests that once fenced a replica for good (LAST_SESSION_INFO and TRUNCATE with session
  id 2^62); each must be refused. Then frames of random bytes on fresh connections.
* an idle flood: many TCP connections that never send a byte, held open, then closed.
* a flipped bit in a sealed segment of a live replica: the node must refuse that record, and
  ``waltz storage recover-partition`` refills it from a healthy replica (the runner does it).

A forged request or a flipped record that is *served* is a violation: the run fails naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from waltz_engine.common.errors import WaltzError
from waltz_engine.disk.record_format import RECORD_HEADER_SIZE_BYTES
from waltz_engine.disk.segment_reader import SegmentReader, SegmentRecord
from waltz_engine.net.channel import ConnectionClosedError
from waltz_engine.storage.admin_client import StorageAdminClient
from waltz_engine.storage.client import StorageClient, StorageRpcError
from waltz_engine.storage.constants import SEGMENT_SUFFIX
from waltz_engine.storage.segment import CORRUPT_RECORD_MESSAGE

FORGED_SESSION_ID = 1 << 62
KEEP_ALL = (1 << 63) - 1  # TRUNCATE to Long.MAX_VALUE: would remove nothing, but moves the session
CONNECT_TIMEOUT_MS = 10_000
FUZZ_CONNECTIONS = 8
FUZZ_MAX_BYTES = 512
FUZZ_READ_TIMEOUT_S = 5.0
IDLE_FLOOD_CONNECTIONS = 300
IDLE_FLOOD_HOLD_S = 3.0


class ForgedFrameServed(WaltzError):
    """A node served a request carrying a session id ZooKeeper never issued."""


class FlippedRecordServed(WaltzError):
    """A node served a record whose bit the smoke run flipped on its disk."""


async def forge_frames(
    host: str, port: int, ssl_context: ssl.SSLContext, key: uuid.UUID, num_partitions: int, rng: random.Random
) -> int:
    """Forged session ids on every partition, then random frames; returns the requests refused.

    A connection cut meanwhile (another fault) ends the attempt quietly; a forged request that
    succeeds raises :class:`ForgedFrameServed`.
    """
    refused = 0
    rogue = StorageClient(host, port, ssl_context, key, num_partitions)
    try:
        await rogue.open(CONNECT_TIMEOUT_MS)
        for partition_id in range(num_partitions):
            for name, request in (
                ("LAST_SESSION_INFO", lambda p: rogue.last_session_info(FORGED_SESSION_ID, p)),
                ("TRUNCATE", lambda p: rogue.truncate(FORGED_SESSION_ID, p, KEEP_ALL)),
            ):
                try:
                    await request(partition_id)
                except StorageRpcError as e:
                    if "disconnected" in str(e):
                        return refused
                    refused += 1
                    continue
                raise ForgedFrameServed(
                    f"{host}:{port} served a forged {name} (session id {FORGED_SESSION_ID}) on "
                    f"partition {partition_id}"
                )
    except (OSError, TimeoutError, StorageRpcError, ConnectionClosedError):
        return refused  # refused or cut off (the node went down meanwhile): nothing was served
    finally:
        await rogue.close()
    for _ in range(FUZZ_CONNECTIONS):
        await _send_garbage(host, port, ssl_context, rng.randbytes(rng.randint(1, FUZZ_MAX_BYTES)))
    return refused


async def _send_garbage(host: str, port: int, ssl_context: ssl.SSLContext, garbage: bytes) -> None:
    """Random bytes after the TLS handshake; the node closes the connection (or times us out)."""
    with contextlib.suppress(OSError, TimeoutError, ssl.SSLError):
        async with asyncio.timeout(CONNECT_TIMEOUT_MS / 1000):
            reader, writer = await asyncio.open_connection(host, port, ssl=ssl_context)
        try:
            writer.write(garbage)
            await writer.drain()
            async with asyncio.timeout(FUZZ_READ_TIMEOUT_S):
                await reader.read()
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()


async def idle_flood(host: str, port: int) -> int:
    """Open many connections that send nothing, hold them, close them; returns how many opened."""
    writers: list[asyncio.StreamWriter] = []

    async def one() -> None:
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(CONNECT_TIMEOUT_MS / 1000):
                _, writer = await asyncio.open_connection(host, port)
            writers.append(writer)

    try:
        await asyncio.gather(*(one() for _ in range(IDLE_FLOOD_CONNECTIONS)))
        await asyncio.sleep(IDLE_FLOOD_HOLD_S)
        return len(writers)
    finally:
        for writer in writers:
            writer.close()


# --- a flipped bit in a sealed segment -------------------------------------------------------


class Flip(NamedTuple):
    partition_id: int
    transaction_id: int
    segment: Path
    offset: int  # the flipped byte's offset in the .seg file


def flip_sealed_bit(partition_directories: Sequence[Path], rng: random.Random) -> Flip | None:
    """Flip one bit of one record's data in a sealed segment (not a partition's last one); None
    while no partition has a sealed segment yet."""
    sealed = [
        (partition_id, segment)
        for partition_id, directory in enumerate(partition_directories)
        for segment in sorted(directory.glob(f"*{SEGMENT_SUFFIX}"))[:-1]
    ]
    if not sealed:
        return None
    partition_id, segment = rng.choice(sealed)
    with SegmentReader(segment) as reader:
        records = [
            item.record
            for item in reader.scan()
            if isinstance(item, SegmentRecord) and item.record.record.data
        ]
    if not records:
        return None
    victim = rng.choice(records)
    offset = victim.offset + RECORD_HEADER_SIZE_BYTES + rng.randrange(len(victim.record.data))
    with segment.open("r+b") as file:
        file.seek(offset)
        byte = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([byte ^ (1 << rng.randrange(8))]))
    return Flip(partition_id, victim.record.transaction_id, segment, offset)


async def refused_on_read(admin: StorageAdminClient, flip: Flip) -> bool:
    """Whether the node refuses the flipped record (never serves it); any other failure (the
    node paused, restarting) raises: it says nothing about the record."""
    try:
        records = await admin.record_list(flip.partition_id, flip.transaction_id, 1)
    except StorageRpcError as e:
        if CORRUPT_RECORD_MESSAGE in str(e):
            return True
        raise
    return not records
