"""A fault whose injection or recovery fails says so, naming the fault (it was dropped silently,
and a run whose flipped segment was never refilled failed its last two checks without a word),
and a node that does not answer is not taken for one that served a flipped record."""

from __future__ import annotations

import asyncio
import random
import ssl
import uuid
from pathlib import Path
from typing import cast

import pytest
from testkit import free_tcp_port

from waltz_engine.smoke.hostile import Flip, forge_frames, refused_on_read
from waltz_engine.smoke.runner import DOWN, UP, SmokeRun, fault_failures
from waltz_engine.smoke.schedule import Fault, FaultKind
from waltz_engine.storage.admin_client import StorageAdminClient
from waltz_engine.storage.client import StorageRpcError

NUM_PARTITIONS = 3
NO_TLS = cast("ssl.SSLContext", None)  # the connection is refused before any handshake


def test_a_failed_fault_is_named_and_a_cancelled_one_is_not() -> None:
    flip = Fault(37.8, FaultKind.SEALED_SEGMENT_FLIP, "storage-0", 2.2)
    frames = Fault(35.9, FaultKind.FORGED_FRAMES, "storage-2")
    late = Fault(49.0, FaultKind.KILL, "server-1", 3.0)
    fine = Fault(6.7, FaultKind.CLIENT_DISCONNECT, "server-0")
    results: list[object] = [
        TimeoutError("no ZooKeeper"),
        StorageRpcError("storage admin: disconnected (connection lost)"),
        asyncio.CancelledError(),
        None,
    ]
    failures = fault_failures([flip, frames, late, fine], results)
    assert failures == [
        "fault sealed-segment-flip storage-0 for 2.2s at 37.8s failed: TimeoutError: no ZooKeeper",
        "fault forged-frames storage-2 at 35.9s failed: StorageRpcError: storage admin: disconnected "
        "(connection lost)",
    ]


def test_a_node_that_does_not_answer_neither_refused_nor_served_the_flipped_record() -> None:
    """It raises, for the refill to try again; it once returned "not refused", and the run
    reported a flipped record served by a node that was only paused."""
    admin = StorageAdminClient("127.0.0.1", free_tcp_port(), None, uuid.uuid4(), NUM_PARTITIONS)
    flip = Flip(0, 1794, Path("0000000000000000000.seg"), 100636)
    with pytest.raises(StorageRpcError, match="disconnected"):
        asyncio.run(refused_on_read(admin, flip))


def test_a_fault_whose_target_is_down_is_skipped_and_said_so() -> None:
    """The run once failed (all seven checks passed, RESULT FAILED) because forged frames found
    their storage node killed by an earlier fault: such a fault is skipped and logged instead."""

    class Run:
        node_state = {"storage-1": DOWN, "storage-2": UP}
        injected: list[Fault] = []
        skipped: list[Fault] = []
        said: list[str] = []

        def elapsed_s(self) -> float:
            return 100.0

        def states(self) -> str:
            return "[.* ]"

        def say(self, text: str) -> None:
            self.said.append(text)

        async def _inject(self, fault: Fault) -> None:
            pass

    run = Run()
    down = Fault(35.9, FaultKind.FORGED_FRAMES, "storage-1")
    asyncio.run(SmokeRun._fault(cast(SmokeRun, run), down))
    assert run.skipped == [down] and run.injected == []
    assert run.said == ["[.* ] fault skipped: forged-frames storage-1 (storage-1 is down)"]
    # A storage disconnect is aimed at a down node's proxy on purpose: injected, not skipped.
    proxy = Fault(36.5, FaultKind.STORAGE_DISCONNECT, "storage-1")
    asyncio.run(SmokeRun._fault(cast(SmokeRun, run), proxy))
    assert run.skipped == [down] and run.injected == [proxy]


def test_forged_frames_at_a_node_that_refuses_the_connection_pass_without_a_failure() -> None:
    """A node that went down meanwhile refuses the connection: nothing was served, so it passes."""
    refused = asyncio.run(
        forge_frames("127.0.0.1", free_tcp_port(), NO_TLS, uuid.uuid4(), NUM_PARTITIONS, random.Random(7))
    )
    assert refused == 0
