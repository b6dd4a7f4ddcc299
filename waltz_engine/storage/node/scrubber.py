"""The storage node's scrubber: reads every record of every assigned partition in the
background, at a bounded rate, so that rot is found before a reader or a recovery needs the
record.

Start-up checks only a bounded window of each segment. Without a scrub, a flipped bit deep in a
sealed segment stays unknown until something reads that record. Each read checks the record's
CRC and data checksum, and a record that fails is remembered in the partition's damage log. So
the scrub is only reads: the damage is then reported (log, ``/health``, ``waltz storage list``)
and ``waltz storage recover-partition`` refills it. The scrub never writes a byte.

With a tier (issue 25), the reads of a partition's evicted range check the tier's copies record
by record (the damage is remembered as for local records), and the copies of segments still on
the local disk are checked against the SHA-256 their manifest names, at the same rate: a copy
that differs is uploaded again from the whole local file (``TierOffloader.check_copy``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from waltz_engine.common.errors import StorageError
from waltz_engine.common.object_store import ObjectStoreError
from waltz_engine.common.tasks import cancel_and_wait
from waltz_engine.storage.segment import CorruptRecordError

if TYPE_CHECKING:  # the node package imports this module
    from waltz_engine.storage.node.partition_worker import PartitionWorker
    from waltz_engine.storage.partition import Partition
    from waltz_engine.storage.tier.offload import TierOffloader

log = logging.getLogger(__name__)

# `storage.scrub.bytes.per.second`: the default reads a 100 GiB node in about 7 hours.
DEFAULT_SCRUB_BYTES_PER_SECOND = 4 * 1024 * 1024
# Records per read: small enough that appends waiting for the partition lock are not delayed.
SCRUB_BATCH_RECORDS = 256
# After a whole pass over every partition, the scrub rests this long before the next one.
SCRUB_PASS_PAUSE_S = 3600.0
# The first pass starts after the node has served for a while (a restart storm is busy enough).
SCRUB_START_DELAY_S = 2.0


class Scrubber:
    def __init__(
        self,
        workers: Callable[[], Mapping[int, PartitionWorker]],
        bytes_per_second: int = DEFAULT_SCRUB_BYTES_PER_SECOND,
        start_delay_s: float = SCRUB_START_DELAY_S,
        tier: TierOffloader | None = None,
    ) -> None:
        assert bytes_per_second > 0
        self._workers = workers
        self._bytes_per_second = bytes_per_second
        self._start_delay_s = start_delay_s
        self._tier = tier
        self._task: asyncio.Task[None] | None = None
        self.passes = 0  # whole passes finished, for tests and metrics

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="scrubber")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        await asyncio.sleep(self._start_delay_s)
        while True:
            for partition_id, worker in sorted(self._workers().items()):
                partition = worker.partition
                if partition is None:
                    continue
                try:
                    await self.scrub_partition(partition)
                except (StorageError, OSError, ObjectStoreError) as e:
                    # Unassigned or closed meanwhile, the disk fails reads, or the tier fails the
                    # read of an evicted segment (seed 1948 of the simulator: that ended the task,
                    # and the node's stop raised the store's error): the next pass tries again.
                    log.warning("scrub of partition %d stopped: %s", partition_id, e)
            self.passes += 1
            await asyncio.sleep(SCRUB_PASS_PAUSE_S)

    async def scrub_partition(self, partition: Partition) -> None:
        """One pass over the partition's records, then over its local segments' tier copies."""
        await self._scrub(partition)
        if self._tier is None:
            return
        try:
            for first in self._tier.local_copies(partition):
                checked_bytes = await self._tier.check_copy(partition, first)
                await asyncio.sleep(checked_bytes / self._bytes_per_second)
        except ObjectStoreError as e:
            log.warning("scrub of partition %d's tier copies stopped: %s", partition.partition_id, e)

    async def _scrub(self, partition: Partition) -> None:
        # Off the loop: the partition's lock is held through an append's fsync, which a failing
        # disk can stretch without end; the loop must not wait on it.
        transaction_id = await asyncio.to_thread(partition.first_transaction_id)
        while transaction_id <= await asyncio.to_thread(partition.max_transaction_id):
            try:
                # Checked by columns (CRCs and data checksums), as RECORD_LIST answers are: a
                # tenth of the CPU of a Record per record. Where a record does not check out,
                # the exact reader takes over and the partition remembers the damage.
                checked = await asyncio.to_thread(partition.records_wire, transaction_id, SCRUB_BATCH_RECORDS)
            except CorruptRecordError as e:
                # The partition remembered it (reported until refilled); go on after it.
                transaction_id = max(transaction_id, e.transaction_id) + 1
                continue
            if not checked.num_records:
                return  # the log ends here (truncated meanwhile)
            transaction_id += checked.num_records
            await asyncio.sleep(checked.data_bytes() / self._bytes_per_second)
