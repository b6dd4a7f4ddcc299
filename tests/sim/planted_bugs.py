"""Historical bugs, planted one at a time by patching (never by a switch in product code), for
``test_sim_finds_planted_bugs``: each plant puts back the code as it was before its fix.

Run the full search (every plant over up to ``SEARCH_SEEDS`` seeds, the first finding seed of
each printed) with ``WALTZ_SIM_SEARCH=1 python -m pytest -q tests/sim/test_sim_finds_planted_bugs.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest

from waltz_engine.client.client import WaltzClient
from waltz_engine.common.errors import WaltzError
from waltz_engine.common.reqid import ReqId
from waltz_engine.server.feeds import FeedClient
from waltz_engine.server.partition import _MOUNT, Partition
from waltz_engine.server.store.recovery import UNKNOWN_HIGH_WATER_MARK, RecoveryManager
from waltz_engine.storage.node.partition_worker import PartitionWorker
from waltz_engine.wire.client_messages import MountRequest

Plant = Callable[[pytest.MonkeyPatch], None]
SEARCH_SEEDS = 300


def barrier_hole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21 item 1 before bc13b25: a raised generation keeps serving from the old store
    session (no reopen, no NOT_READY for a mount from a newer generation), and an append whose
    store future raised counts as decided."""

    async def set_generation(self: Partition, generation: int) -> None:
        if generation > self.generation:
            self.generation = generation
            await self.store.set_generation(generation)
            self._store_generation = generation  # the append task never reopens

    async def mount(self: Partition, client: FeedClient, request: MountRequest) -> None:
        req_id = request.req_id
        self._register(client, req_id.client_id, req_id.generation, request.seq_num)
        if self._is_valid(client, req_id.client_id):
            await self._queue.put((_MOUNT, client, request))

    def outcome_unknown(self: Partition, append_number: int, req_id: ReqId) -> None:
        self._barrier.decide(append_number)

    monkeypatch.setattr(Partition, "set_generation", set_generation)
    monkeypatch.setattr(Partition, "mount", mount)
    monkeypatch.setattr(Partition, "_outcome_unknown", outcome_unknown)


def forged_fence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before 624b99e: every request, a read too, moved the node's fencing session id on receipt,
    to any id (none checked against ZooKeeper)."""

    async def submit(self: PartitionWorker, conn: Any, msg: Any) -> None:
        self.session_id = max(self.session_id, msg.session_id)
        await self._put((conn, msg))

    monkeypatch.setattr(PartitionWorker, "submit", submit)


def retry_worker_dies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before 05e9d3d: the retry worker caught only WaltzError, so an application error raised by
    a retried execute ended it and the retries after it waited forever."""

    async def retry_worker(self: WaltzClient) -> None:
        while True:
            context = await self._retry_queue.get()
            with contextlib.suppress(WaltzError):
                await self._attempt(context)

    monkeypatch.setattr(WaltzClient, "_retry_worker", retry_worker)


def recovery_cuts_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recovery that truncates below the low-water mark: it resolves one transaction below what
    its quorum reported, without 41bc83b's refusal to cut a replica below its low-water mark."""
    resolve, set_resolved = RecoveryManager._resolve, RecoveryManager._set_resolved

    async def resolve_unguarded(
        self: RecoveryManager, replica_id: Any, connection: Any, voting: bool, high: int, low: int
    ) -> None:
        await resolve(self, replica_id, connection, voting, high, UNKNOWN_HIGH_WATER_MARK)

    def set_resolved_low(self: RecoveryManager, high_water_mark: int) -> None:
        set_resolved(self, max(UNKNOWN_HIGH_WATER_MARK, high_water_mark - 1))

    monkeypatch.setattr(RecoveryManager, "_resolve", resolve_unguarded)
    monkeypatch.setattr(RecoveryManager, "_set_resolved", set_resolved_low)


PLANTS: dict[str, Plant] = {
    "barrier_hole": barrier_hole,
    "forged_fence": forged_fence,
    "retry_worker_dies": retry_worker_dies,
    "recovery_cuts_committed": recovery_cuts_committed,
}
