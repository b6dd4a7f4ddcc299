"""kill -9 (and SIGTERM) in the middle of a stream of pipelined appends of 5 records each, twice.

After each restart the partition holds exactly what the storage engine promises (the recovery's
docstring, ``Segment._recover``):

(a) every record present is whole and its checksums verify: it reads back as the record appended
    with that txid (and the files verify clean at the end);
(b) every acknowledged append is wholly present;
(c) an unacknowledged append is wholly present, cut, or present as a prefix of whole records:
    never a torn record, never a gap. The records present are exactly txids 0..max, nothing past
    max, and max is no further than what was sent.

A kill -9 that lands inside the data write of an append leaves a prefix of it, so after kill -9
the last append present may be partial. SIGTERM is a clean stop (the node completes the batch in
hand, whole requests), so after SIGTERM whole appends only.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from storage_node_support import ISSUED_SESSION_ID, StorageNodeProcess, make_records, start_storage_node

from waltz_engine.ops.inspect import verify
from waltz_engine.storage.client import StorageClient, StorageRpcError

PARTITION = 0
# ZooKeeper's store session: after the restart the replica holds records but no low-water mark
# set by a session, so only the latest session may reach it again (session_bounds).
SESSION_ID = ISSUED_SESSION_ID
RECORDS_PER_APPEND = 5
APPENDS_IN_FLIGHT = 32
# The signal is sent once this many appends have been acknowledged, while more are in flight.
ACKS_BEFORE_SIGNAL = 150
MAX_APPENDS_PER_ROUND = 5_000
ROUNDS = 2


async def _stream_until_signal(node: StorageNodeProcess, first_txid: int, sig: int) -> tuple[int, int]:
    """Pipelined appends from ``first_txid`` until the node dies.

    Returns the highest txid answered SUCCESS and the highest txid sent.
    """
    client: StorageClient = node.data_client()
    await client.open()
    acked: list[int] = []  # last txid of each acknowledged append
    window = asyncio.Semaphore(APPENDS_IN_FLIGHT)
    signalled = False

    async def one(txid: int) -> None:
        nonlocal signalled
        try:
            await client.append(SESSION_ID, PARTITION, make_records(txid, RECORDS_PER_APPEND, PARTITION, 64))
            acked.append(txid + RECORDS_PER_APPEND - 1)
            if len(acked) >= ACKS_BEFORE_SIGNAL and not signalled:
                signalled = True
                os.kill(node.pid, sig)
        except StorageRpcError:
            pass  # in flight when the node went away: may or may not be durable
        finally:
            window.release()

    tasks = []
    txid = first_txid
    for _ in range(MAX_APPENDS_PER_ROUND):
        await window.acquire()
        if not client.is_open:
            window.release()
            break
        tasks.append(asyncio.create_task(one(txid)))
        txid += RECORDS_PER_APPEND
    max_sent = txid - 1
    await asyncio.gather(*tasks)
    await client.close()
    assert signalled, "the node was not signalled: the stream ended first"
    # Acknowledgements arrive in order of the txids (one partition, one connection).
    assert acked == sorted(acked)
    return acked[-1], max_sent


async def _check_recovered(
    node: StorageNodeProcess, first_txid: int, max_acked: int, max_sent: int, whole_appends: bool
) -> int:
    """The promise of the module docstring for a round whose appends started at ``first_txid``;
    returns the highest txid present."""
    client = node.data_client()
    await client.open()
    try:
        # A restarted node knows only its persisted session; LAST_SESSION_INFO opens ours again.
        await client.last_session_info(SESSION_ID, PARTITION)
        max_txid = await client.max_transaction_id(SESSION_ID, PARTITION)
        # (b) every acknowledged append is wholly present.
        assert max_txid >= max_acked, f"acknowledged through {max_acked}, recovered through {max_txid}"
        # (c) nothing past what was sent.
        assert max_txid <= max_sent, f"txid {max_txid} present but only {max_sent} sent"
        # (a) and (c): txids 0..max_txid, each the whole record appended with that txid (no torn
        # record, no gap), and nothing after it.
        stored = await client.records(SESSION_ID, PARTITION, 0, max_txid + 1)
        assert stored == make_records(0, max_txid + 1, PARTITION, 64)
        assert await client.records(SESSION_ID, PARTITION, max_txid + 1, RECORDS_PER_APPEND) == []
        if whole_appends:
            partial = (max_txid + 1 - first_txid) % RECORDS_PER_APPEND
            assert partial == 0, f"{partial} record(s) of an append after a clean stop"
        return max_txid
    finally:
        await client.close()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_acknowledged_appends_survive_signal(zookeeper: str, tmp_path: Path, sig: int) -> None:
    node = start_storage_node(zookeeper, tmp_path, 1)
    try:
        next_txid = 0
        for _ in range(ROUNDS):
            max_acked, max_sent = node.run(_stream_until_signal(node, next_txid, sig))
            exit_code = node.wait_exit()
            if sig == signal.SIGTERM:
                assert exit_code == 0, node.log_text()
            node.start()
            clean_stop = sig == signal.SIGTERM
            next_txid = node.run(_check_recovered(node, next_txid, max_acked, max_sent, clean_stop)) + 1
        assert node.terminate() == 0
        report = verify(node.directory)
        assert report.ok, [str(p) for p in report.problems]
        assert report.records == next_txid
    finally:
        node.close()
