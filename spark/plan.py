"""Options of the ``waltz`` data source and the read plan they make: per partition, the replica
to read, the txid range (never past the committed bound) and its segment slices.

Options (all strings, as Spark passes them):

``path`` / ``paths``
    storage directories, comma-separated (local files: executors read them directly).
``zookeeper`` + ``cluster.root``
    find the committed high-water marks from the servers. Without them the bound is the
    control files' low-water mark, or ``to_txid`` when given (the caller vouches for it).
``partitions``
    comma-separated ids and ranges (``0,2-3``); default every partition found.
``from_txid`` / ``to_txid``
    inclusive range, the same for every partition.
``from_txids`` / ``to_txids``
    JSON ``{"partition": txid}``, per partition; win over the single values (exports use them).
``on_corrupt``
    ``fail`` (default) or ``skip`` records whose checksum fails.
``max_rows_per_trigger``
    streaming only: at most this many transactions per micro-batch, over all partitions
    (default: everything committed since the last one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from spark.committed import control_low_water_marks, server_high_water_marks
from spark.layout import NO_TRANSACTION, Replica, choose_replica, discover, slices
from spark.segments import ON_CORRUPT_CHOICES, ON_CORRUPT_FAIL, SegmentSlice
from waltz_engine.common.errors import WaltzError
from waltz_engine.zk.connection import ZooKeeperSettings

OPTION_PATH = "path"
OPTION_PATHS = "paths"
OPTION_ZOOKEEPER = "zookeeper"
OPTION_CLUSTER_ROOT = "cluster.root"
OPTION_PARTITIONS = "partitions"
OPTION_FROM_TXID = "from_txid"
OPTION_TO_TXID = "to_txid"
OPTION_FROM_TXIDS = "from_txids"
OPTION_TO_TXIDS = "to_txids"
OPTION_ON_CORRUPT = "on_corrupt"
OPTION_MAX_ROWS_PER_TRIGGER = "max_rows_per_trigger"
LIST_SEPARATOR = ","
RANGE_SEPARATOR = "-"
MAX_TXID = (1 << 63) - 1


class OptionsError(WaltzError):
    """The data source options are incomplete or malformed."""


def parse_partitions(text: str) -> list[int]:
    """``0,2-3`` -> ``[0, 2, 3]``."""
    result: set[int] = set()
    for item in filter(None, (t.strip() for t in text.split(LIST_SEPARATOR))):
        low, separator, high = item.partition(RANGE_SEPARATOR)
        try:
            first, last = int(low), int(high if separator else low)
        except ValueError:
            raise OptionsError(f"partitions: expected ids or ranges like 0,2-3, got {text!r}") from None
        result.update(range(first, last + 1))
    return sorted(result)


def _txid_map(options: Mapping[str, str], key: str) -> dict[int, int]:
    text = options.get(key)
    if not text:
        return {}
    try:
        return {int(p): int(t) for p, t in json.loads(text).items()}
    except (ValueError, AttributeError) as e:
        raise OptionsError(f'{key}: expected JSON like {{"0": 42}}, got {text!r} ({e})') from None


def _txid(options: Mapping[str, str], key: str) -> int | None:
    """An integer option (a txid or a count), None when absent."""
    text = options.get(key)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise OptionsError(f"{key}: expected an integer, got {text!r}") from None


@dataclass(frozen=True)
class ReadOptions:
    directories: tuple[Path, ...]
    zookeeper: ZooKeeperSettings | None
    partitions: tuple[int, ...] | None
    from_txid: int
    to_txid: int | None
    from_txids: Mapping[int, int]
    to_txids: Mapping[int, int]
    on_corrupt: str
    max_rows_per_trigger: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        paths = LIST_SEPARATOR.join(filter(None, (options.get(OPTION_PATH), options.get(OPTION_PATHS))))
        directories = tuple(Path(p.strip()) for p in paths.split(LIST_SEPARATOR) if p.strip())
        connect, root = options.get(OPTION_ZOOKEEPER), options.get(OPTION_CLUSTER_ROOT)
        zookeeper = None
        if connect or root:
            if not (connect and root):
                raise OptionsError(f"give both {OPTION_ZOOKEEPER} and {OPTION_CLUSTER_ROOT}, or neither")
            zookeeper = ZooKeeperSettings.resolve(zookeeper=connect, cluster_root=root)
        if not directories:
            raise OptionsError(
                f"no storage directories: set {OPTION_PATH} or {OPTION_PATHS} (comma-separated). "
                f"The reader reads segment files directly; {OPTION_ZOOKEEPER} only finds the committed "
                "high-water marks, it cannot locate data on other machines"
            )
        on_corrupt = options.get(OPTION_ON_CORRUPT, ON_CORRUPT_FAIL)
        if on_corrupt not in ON_CORRUPT_CHOICES:
            raise OptionsError(
                f"{OPTION_ON_CORRUPT} must be one of {', '.join(ON_CORRUPT_CHOICES)}, got {on_corrupt!r}"
            )
        max_rows = _txid(options, OPTION_MAX_ROWS_PER_TRIGGER)
        if max_rows is not None and max_rows < 1:
            raise OptionsError(f"{OPTION_MAX_ROWS_PER_TRIGGER} must be at least 1, got {max_rows}")
        text = options.get(OPTION_PARTITIONS)
        return cls(
            directories=directories,
            zookeeper=zookeeper,
            partitions=tuple(parse_partitions(text)) if text else None,
            from_txid=max(0, _txid(options, OPTION_FROM_TXID) or 0),
            to_txid=_txid(options, OPTION_TO_TXID),
            from_txids=_txid_map(options, OPTION_FROM_TXIDS),
            to_txids=_txid_map(options, OPTION_TO_TXIDS),
            on_corrupt=on_corrupt,
            max_rows_per_trigger=max_rows,
        )


@dataclass(frozen=True)
class PartitionPlan:
    partition_id: int
    replica: Replica
    from_txid: int
    to_txid: int  # inclusive; from_txid - 1 when there is nothing to read
    # Where the committed bound came from: "server", "control-file" or "to_txid".
    bound_source: str

    @property
    def slices(self) -> list[SegmentSlice]:
        return slices(self.replica, self.from_txid, self.to_txid)

    @property
    def count(self) -> int:
        return max(0, self.to_txid - self.from_txid + 1)


def found_replicas(options: ReadOptions) -> dict[int, list[Replica]]:
    replicas = discover(options.directories)
    if options.partitions is not None:
        replicas = {p: rs for p, rs in replicas.items() if p in options.partitions}
    return replicas


def committed_bounds(
    options: ReadOptions, replicas: Mapping[int, list[Replica]]
) -> tuple[dict[int, int], str]:
    """Per partition, the last committed txid, and where that came from."""
    if options.zookeeper is not None:
        return server_high_water_marks(options.zookeeper, sorted(replicas)), "server"
    if options.to_txid is not None or options.to_txids:
        # The caller vouches for its bound; without ZooKeeper nothing better is known.
        return {p: MAX_TXID for p in replicas}, "to_txid"
    return control_low_water_marks(replicas), "control-file"


def plan(options: ReadOptions, bounds: Mapping[int, int] | None = None) -> list[PartitionPlan]:
    """The read plan; ``bounds`` (committed txids) saves the lookup when the caller has them."""
    replicas = found_replicas(options)
    source = "given"
    if bounds is None:
        bounds, source = committed_bounds(options, replicas)
    result = []
    for partition_id in sorted(replicas):
        replica = choose_replica(replicas[partition_id])
        start = max(options.from_txids.get(partition_id, options.from_txid), replica.first_txid)
        end = min(
            options.to_txids.get(partition_id, MAX_TXID if options.to_txid is None else options.to_txid),
            bounds.get(partition_id, NO_TRANSACTION),
            replica.max_txid,  # a bound beyond the chosen copy's log cannot be read from these files
        )
        result.append(PartitionPlan(partition_id, replica, start, max(end, start - 1), source))
    return result
