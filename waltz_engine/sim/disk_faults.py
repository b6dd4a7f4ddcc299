"""The disk faults the simulated world applies to its storage nodes (a part of
:class:`waltz_engine.sim.world.SimWorld`, kept apart for size): rot where the node knows the bytes
are durable, a full disk, slow syncs, failed whole-disk syncs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.partition_info import PARTITION_INFO_SIZE_BYTES, STRUCT1_OFFSET, partition_info_offset
from waltz_engine.disk.record_format import CHECKPOINT_INTERVAL, INDEX_ENTRY, INDEX_ENTRY_SIZE_BYTES
from waltz_engine.sim.disk import SimDisk
from waltz_engine.sim.loop import SimLoop
from waltz_engine.storage.constants import INDEX_SUFFIX, SEGMENT_SUFFIX
from waltz_engine.storage.node.node import StorageNode
from waltz_engine.storage.segment_scan import _java_div
from waltz_engine.storage.tier.offload import CACHE_DIRECTORY

if TYPE_CHECKING:
    from waltz_engine.sim.operator import Operator
    from waltz_engine.sim.world import WorldShape

# A full disk leaves a node this much room beyond what it holds; a slow sync takes this long.
DISK_FULL_HEADROOM_BYTES = (0, 4096)
SLOW_SYNC_MS = (20.0, 2_000.0)


class DiskFaults:
    """Disk faults of the world's storage nodes (the world's state, which ``SimWorld`` sets)."""

    loop: SimLoop
    shape: WorldShape
    disks: dict[str, SimDisk]
    storage: list[StorageNode]
    dead: set[str]
    damage: list[str]
    damaged_host: str | None
    _control_damaged: bool
    sync_latency_ms: dict[str, tuple[float, float] | None]
    operator: Operator
    slow_syncs_until_s: dict[str, float]

    def flip_bit(self, number: int) -> None:
        """Rot on one storage node (the same one all seed long, so a quorum stays whole): a bit
        of a record or index entry the node knows is durable changes in place, in a sealed
        segment or in the open one up to its durable point (the last checkpoint or the local
        low-water mark: past it, rot looks like a torn write, which recovery rightly cuts), or
        (``control_file_flips``) a bit of a partition's struct in the control file."""
        host = f"storage-{number}" if self.damaged_host is None else self.damaged_host
        self.damaged_host = host
        disk = self.disks[host]
        node = self.storage[int(host.rsplit("-", 1)[1])]
        rng = self.loop.rng
        if host in self.dead or node.manager is None:
            return
        if any(f"storage-{lost}" != host for lost in self.operator.lost):
            return  # another node is away past the grace: rot here would be a second failure
        # Only the replicas it holds (a move leaves a moved-away partition's files behind).
        assigned = {str(partition_id) for partition_id in node.manager.assigned_partition_ids()}
        files = [
            path
            for path in disk.files()
            if path.name.endswith((SEGMENT_SUFFIX, INDEX_SUFFIX)) and path.parent.name in assigned
        ]
        if self.shape.control_file_flips and not self._control_damaged:
            files += [path for path in disk.files() if path.name.endswith(".ctl")]
        if not files:
            return
        path = rng.choice(files)
        size_bytes = disk.file_size_bytes(path)
        if path.name.endswith(".ctl"):
            offset = _control_struct_offset(rng, size_bytes)
            self._control_damaged = True
        else:
            end = self._durable_end(disk, node, path)
            if end <= HEADER_SIZE_BYTES:
                return  # nothing known durable in it yet
            offset = rng.randrange(HEADER_SIZE_BYTES, end)
        bit = rng.randrange(8)
        disk.flip_bit(path, offset, bit)
        self.damage.append(f"{host}:{path} byte {offset} bit {bit}")
        self.loop.record("fault", f"bit flip {host}:{path} byte {offset} bit {bit}")

    @staticmethod
    def _durable_end(disk: SimDisk, node: StorageNode, path: Path) -> int:
        """The end of the bytes of ``path`` (a segment's data or index) that hold records the node
        knows are durable: all of a sealed segment; the open one's up to its durable point."""
        assert node.manager is not None
        first = int(path.stem)
        directory = path.parent
        if directory.parent.name == CACHE_DIRECTORY:
            # A copy the tier cached (of a sealed segment) is whole: the partition's own durable
            # point says nothing of it (it bounded the last copy past its end, seed 626).
            return disk.file_size_bytes(path)
        starts = sorted(int(p.stem) for p in disk.glob(directory, f"*{SEGMENT_SUFFIX}"))
        index = directory / f"{path.stem}{INDEX_SUFFIX}"
        if first != starts[-1]:
            return disk.file_size_bytes(path)  # sealed
        partition = node.manager.partition(int(directory.name))
        local_low_water_mark = partition.last_session_info().local_low_water_mark
        max_transaction_id = partition.max_transaction_id()
        # As start-up recovery reckons it (segment_scan.recovery_window).
        checkpoint = _java_div(max_transaction_id - 1, CHECKPOINT_INTERVAL) * CHECKPOINT_INTERVAL
        durable = max(checkpoint - 1, local_low_water_mark)
        if max_transaction_id <= local_low_water_mark:
            durable = max_transaction_id
        if durable < first:
            return 0
        if path.name.endswith(INDEX_SUFFIX):
            return HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (durable + 1 - first)
        entries = disk.read_bytes(index)
        position = HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (durable + 1 - first)
        if durable + 1 > max_transaction_id or position + INDEX_ENTRY_SIZE_BYTES > len(entries):
            return disk.file_size_bytes(path)  # every record of it is durable
        return int(INDEX_ENTRY.unpack_from(entries, position)[0])

    def fill_disk(self, number: int) -> None:
        disk = self.disks[f"storage-{number}"]
        disk.capacity_bytes = disk.used_bytes() + self.loop.rng.randint(*DISK_FULL_HEADROOM_BYTES)
        self.loop.record("fault", f"disk full storage-{number} at {disk.capacity_bytes} bytes")

    def free_disk(self, number: int) -> None:
        self.disks[f"storage-{number}"].capacity_bytes = None
        self.loop.record("fault", f"disk room again storage-{number}")

    def fail_whole_syncs(self, number: int, count: int) -> None:
        """The next ``count`` whole-disk syncs of storage-``number`` fail (EIO), making nothing
        durable: each fails every partition of its pass (cut back, answered with the error)."""
        self.disks[f"storage-{number}"].failing_whole_syncs += count
        self.loop.record("fault", f"whole-disk syncs fail storage-{number}: the next {count}")

    def slow_syncs(self, number: int, slow: bool, duration_s: float = 0.0) -> None:
        """Syncs of storage-``number`` slow for ``duration_s`` from now (``slow``), or fast again.
        A sync is slow only if it begins within that time: the syncs of one pass run one after
        another, so a pass begun near the end does not pay slow syncs past it."""
        host = f"storage-{number}"
        self.sync_latency_ms[host] = SLOW_SYNC_MS if slow else None
        if slow:
            self.slow_syncs_until_s[host] = self.loop.time() + duration_s
        else:
            self.slow_syncs_until_s.pop(host, None)
        self.loop.record("fault", f"syncs {'slow' if slow else 'fast'} storage-{number}")


def _control_struct_offset(rng: Any, size_bytes: int) -> int:
    """A byte of one of a partition's two info structs in the control file (not of the file's
    header: a damaged header is a node that refuses to start, the operator's to repair, not in
    the schedule; nor of the partition's first 4 bytes, its id)."""
    partitions = max(1, (size_bytes - HEADER_SIZE_BYTES) // PARTITION_INFO_SIZE_BYTES)
    start = partition_info_offset(rng.randrange(partitions)) + STRUCT1_OFFSET
    return min(size_bytes - 1, start + int(rng.randrange(PARTITION_INFO_SIZE_BYTES - STRUCT1_OFFSET)))
