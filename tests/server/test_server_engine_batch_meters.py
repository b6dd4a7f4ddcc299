"""A partition's meters when a batch of commits is decided in one call (issue 33): the clock is
read once for the batch, and still every transaction's latency is its own (from its arrival to
its batch's decision), and every meter counts each transaction; the next batch reads the clock
again. Real TLS client connection and engine (its store replaced by one that decides when told)."""

from __future__ import annotations

import pytest
from server_support.engine_harness import Harness, append, req, run, wait_until

from waltz_engine.server import partition as partition_module
from waltz_engine.server.store.queued_appends import AppendDecision
from waltz_engine.wire.client_messages import PARTITION_STATE_READY, MountRequest, MountResponse

GROUP = "waltz-server.partition-0"


class _Clock:
    """The partition module's clock, read by the test: ``now_s`` as set, each read counted."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.reads = 0

    def monotonic_s(self) -> float:
        self.reads += 1
        return self.now_s


def test_a_batch_decided_in_one_call_reads_the_clock_once_and_times_each_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_clock = _Clock()
    monkeypatch.setattr(partition_module, "clock", fake_clock)

    async def test(h: Harness) -> None:
        client = await h.client()
        await client.send(MountRequest(req(1, 0), -1, 1))
        assert await client.receive() == MountResponse(req(1, 0), PARTITION_STATE_READY)
        partition = h.core.partitions[0]
        taken: list[AppendDecision] = []

        def append_lone(
            req_id: object, header: int, data: bytes, checksum: int, decided: AppendDecision
        ) -> bool:
            taken.append(decided)
            return True

        # Appends are taken at once (the append task idles) by a store that decides when told.
        partition._append_lone = append_lone

        async def arrives(seq: int, now_s: float) -> None:
            fake_clock.now_s = now_s
            await client.send(append(req(1, seq), -1))
            await wait_until(lambda: len(taken) == seq, f"append {seq} taken")

        for seq, now_s in ((1, 1.0), (2, 2.0), (3, 3.0)):
            await arrives(seq, now_s)
        assert fake_clock.reads == 3, "one read per arrival"

        # One batch: three decisions in one call, the last one marked so.
        fake_clock.now_s = 10.0
        for transaction_id, decided in enumerate(taken):
            decided(transaction_id, None, transaction_id == len(taken) - 1)
        assert fake_clock.reads == 4, "one read for the whole batch"
        metrics = h.core.metrics.to_json()
        latency = metrics["timers"][f"{GROUP}.response-latency"]
        assert (latency["count"], latency["min"], latency["max"]) == (3, 7000.0, 9000.0)
        assert metrics["meters"][f"{GROUP}.successful-append"]["count"] == 3
        assert metrics["meters"][f"{GROUP}.transaction"]["count"] == 3
        assert partition.commit_high_water_mark == 2

        # The next batch (of one) reads the clock again: none of the last batch's time is kept.
        await arrives(4, 20.0)
        fake_clock.now_s = 30.0
        taken[3](3, None, True)
        assert fake_clock.reads == 6
        metrics = h.core.metrics.to_json()
        latency = metrics["timers"][f"{GROUP}.response-latency"]
        assert (latency["count"], latency["max"]) == (4, 10000.0)
        assert metrics["meters"][f"{GROUP}.successful-append"]["count"] == 4
        assert metrics["meters"][f"{GROUP}.transaction"]["count"] == 4
        await client.close()

    run(test)
