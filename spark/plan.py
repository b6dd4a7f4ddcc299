"""Options of the ``waltz`` data source and the read plan they make: per partition, the txid range
(never past the committed bound) and its slices, read over the network or from local files.

Options (all strings, as Spark passes them; names are case-insensitive; the README lists them):

``zookeeper`` + ``cluster.root``, or ``config``
    the cluster: ZooKeeper and the root, or a client YAML holding them (``config``, also its
    ``client.ssl.*`` or ``ssl.*`` keys). Without directories, records are read over the
    network from the storage nodes' admin ports (:mod:`waltz_engine.storage.network_reader`);
    the committed bound always comes from the servers.
``ssl.keyStore.location`` ... ``ssl.trustStore.type``
    TLS towards the cluster, as the client's ``ssl.*`` keys.
``path`` / ``paths``
    storage directories, comma-separated: read these local files instead of the network (the
    executors must see them). Without a cluster, ``to_txid`` (or ``to_txids``) must bound them.
``partitions``
    comma-separated ids and ranges (``0,2-3``); default every partition.
``from_txid`` / ``to_txid``
    inclusive range, the same for every partition.
``from_txids`` / ``to_txids``
    JSON ``{"partition": txid}``, per partition; win over the single values (exports use them).
``on_corrupt``
    ``fail`` (default) or ``skip`` records whose checksum fails (local files; over the network a
    damaged record is read from another replica, and the read fails if none has it whole).
``tier.url``
    the storage nodes' ``storage.tier.url``: the ranges their tier holds are read from the
    object store itself (:mod:`spark.tier`), the rest over the network; needs the cluster.
``max_rows_per_trigger``
    streaming only: at most this many transactions per micro-batch, over all partitions
    (default: everything committed since the last one).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from spark.layout import NO_TRANSACTION, Replica, choose_replica, discover, slices
from spark.segments import ON_CORRUPT_CHOICES, ON_CORRUPT_FAIL, SegmentSlice
from spark.tier import TierSlice, tier_slices
from waltz_engine.common.config import Config
from waltz_engine.common.errors import WaltzError
from waltz_engine.net.tls import TlsConfig
from waltz_engine.storage import network_reader
from waltz_engine.storage.network_reader import ClusterAccess, NetworkSlice, committed_high_water_marks
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
OPTION_CONFIG = "config"
OPTION_TIER_URL = "tier.url"
SSL_PREFIX = "ssl."
# The TLS keys, as the client's config spells them (Spark passes option names lower-cased).
SSL_KEYS = (
    "keyStore.location",
    "keyStore.password",
    "keyStore.type",
    "trustStore.location",
    "trustStore.password",
    "trustStore.type",
)
CLIENT_SSL_PREFIX = "client"  # a client YAML's TLS keys: client.ssl.* (WaltzClientConfig)
KNOWN_OPTIONS = (
    OPTION_ZOOKEEPER,
    OPTION_CLUSTER_ROOT,
    OPTION_CONFIG,
    *(SSL_PREFIX + k for k in SSL_KEYS),
    OPTION_PATH,
    OPTION_PATHS,
    OPTION_PARTITIONS,
    OPTION_FROM_TXID,
    OPTION_TO_TXID,
    OPTION_FROM_TXIDS,
    OPTION_TO_TXIDS,
    OPTION_ON_CORRUPT,
    OPTION_MAX_ROWS_PER_TRIGGER,
    OPTION_TIER_URL,
)
BOUND_SERVER = "server"
BOUND_GIVEN = "to_txid"
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


def _check_known(options: Mapping[str, str]) -> None:
    known = {k.lower() for k in KNOWN_OPTIONS}
    unknown = sorted(k for k in options if k.lower() not in known)
    if unknown:
        raise OptionsError(
            f"unknown option(s) {', '.join(unknown)}: the waltz source knows {', '.join(KNOWN_OPTIONS)}"
        )


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}


def _tls(options: Mapping[str, str], config: Config | None) -> TlsConfig:
    """The options' ``ssl.*`` keys, else the config file's ``client.ssl.*``, else its ``ssl.*``."""
    given = {
        f"x.ssl.{k}": options[(SSL_PREFIX + k).lower()]
        for k in SSL_KEYS
        if (SSL_PREFIX + k).lower() in options
    }
    if given:
        return TlsConfig.from_flat(given, "x")
    if config is None:
        return TlsConfig()
    flat = config.as_dict()
    client = TlsConfig.from_flat(flat, CLIENT_SSL_PREFIX)
    if client != TlsConfig():
        return client
    return TlsConfig.from_flat({f"x.{k}": v for k, v in flat.items() if k.startswith(SSL_PREFIX)}, "x")


def _cluster(options: Mapping[str, str]) -> ClusterAccess | None:
    connect, root = options.get(OPTION_ZOOKEEPER), options.get(OPTION_CLUSTER_ROOT)
    path = options.get(OPTION_CONFIG)
    config = Config.load(Path(path)) if path else None
    if not (connect or root or config):
        return None
    if config is None and not (connect and root):
        raise OptionsError(f"give both {OPTION_ZOOKEEPER} and {OPTION_CLUSTER_ROOT}, or {OPTION_CONFIG}")
    settings = ZooKeeperSettings.resolve(zookeeper=connect, cluster_root=root, config=config)
    return ClusterAccess(settings, _tls(options, config))


@dataclass(frozen=True)
class PartitionFilter:
    """The partitions pushed-down filters select: ``low..high``, and among ``ids`` when given.
    Lenient, unlike the ``partitions`` option: a filter naming no partition of the cluster
    selects nothing."""

    low: int
    high: int
    ids: frozenset[int] | set[int] | None = None

    def selects(self, partition_id: int) -> bool:
        return self.low <= partition_id <= self.high and (self.ids is None or partition_id in self.ids)

    def within(self, other: PartitionFilter | None) -> PartitionFilter:
        if other is None:
            return self
        ids = (
            self.ids
            if other.ids is None
            else other.ids
            if self.ids is None
            else set(self.ids) & set(other.ids)
        )
        return PartitionFilter(max(self.low, other.low), min(self.high, other.high), ids)


@dataclass(frozen=True)
class ReadOptions:
    directories: tuple[Path, ...]
    cluster: ClusterAccess | None
    partitions: tuple[int, ...] | None
    from_txid: int
    to_txid: int | None
    from_txids: Mapping[int, int]
    to_txids: Mapping[int, int]
    on_corrupt: str
    max_rows_per_trigger: int | None = None
    partition_filter: PartitionFilter | None = None  # from pushed-down filters
    tier_url: str | None = None  # the nodes' tier, read directly (network reads only)

    def selects(self, partition_id: int) -> bool:
        return self.partition_filter is None or self.partition_filter.selects(partition_id)

    @property
    def zookeeper(self) -> ZooKeeperSettings | None:
        return self.cluster.zookeeper if self.cluster is not None else None

    @property
    def over_network(self) -> bool:
        return not self.directories

    @classmethod
    def parse(cls, given: Mapping[str, str]) -> ReadOptions:
        _check_known(given)
        options = _lower(given)
        paths = LIST_SEPARATOR.join(filter(None, (options.get(OPTION_PATH), options.get(OPTION_PATHS))))
        directories = tuple(Path(p.strip()) for p in paths.split(LIST_SEPARATOR) if p.strip())
        cluster = _cluster(options)
        if cluster is None and not directories:
            raise OptionsError(
                f"where is the log? Give the cluster ({OPTION_ZOOKEEPER} and {OPTION_CLUSTER_ROOT}, or "
                f"{OPTION_CONFIG} with a client YAML), or local storage directories ({OPTION_PATHS})"
            )
        to_txid, to_txids = _txid(options, OPTION_TO_TXID), _txid_map(options, OPTION_TO_TXIDS)
        if cluster is None and to_txid is None and not to_txids:
            raise OptionsError(
                f"without the cluster the committed bound is unknown (a control file's low-water mark "
                f"lags what is committed): give {OPTION_ZOOKEEPER} and {OPTION_CLUSTER_ROOT} (or "
                f"{OPTION_CONFIG}), or the last committed txid as {OPTION_TO_TXID}"
            )
        on_corrupt = options.get(OPTION_ON_CORRUPT, ON_CORRUPT_FAIL)
        if on_corrupt not in ON_CORRUPT_CHOICES:
            raise OptionsError(
                f"{OPTION_ON_CORRUPT} must be one of {', '.join(ON_CORRUPT_CHOICES)}, got {on_corrupt!r}"
            )
        max_rows = _txid(options, OPTION_MAX_ROWS_PER_TRIGGER)
        if max_rows is not None and max_rows < 1:
            raise OptionsError(f"{OPTION_MAX_ROWS_PER_TRIGGER} must be at least 1, got {max_rows}")
        tier_url = options.get(OPTION_TIER_URL) or None
        if tier_url is not None and directories:
            raise OptionsError(
                f"{OPTION_TIER_URL} is read with the cluster's network reads: give it without "
                f"{OPTION_PATHS}, or read the directories alone"
            )
        text = options.get(OPTION_PARTITIONS)
        return cls(
            directories=directories,
            cluster=cluster,
            partitions=tuple(parse_partitions(text)) if text else None,
            from_txid=max(0, _txid(options, OPTION_FROM_TXID) or 0),
            to_txid=to_txid,
            from_txids=_txid_map(options, OPTION_FROM_TXIDS),
            to_txids=to_txids,
            on_corrupt=on_corrupt,
            max_rows_per_trigger=max_rows,
            tier_url=tier_url,
        )


# One unit of work: a segment's txids (local files or the tier) or a partition's (the network).
Slice = SegmentSlice | NetworkSlice | TierSlice


@dataclass(frozen=True)
class PartitionPlan:
    partition_id: int
    from_txid: int
    to_txid: int  # inclusive; from_txid - 1 when there is nothing to read
    # Where the committed bound came from: "server" or "to_txid" (given).
    bound_source: str
    slices: tuple[Slice, ...]

    @property
    def count(self) -> int:
        return max(0, self.to_txid - self.from_txid + 1)


def found_replicas(options: ReadOptions) -> dict[int, list[Replica]]:
    replicas = discover(options.directories)
    return {
        p: rs
        for p, rs in replicas.items()
        if (options.partitions is None or p in options.partitions) and options.selects(p)
    }


def _wanted_end(options: ReadOptions, partition_id: int) -> int:
    return options.to_txids.get(partition_id, MAX_TXID if options.to_txid is None else options.to_txid)


def _given_bounds(options: ReadOptions, partitions: list[int]) -> dict[int, int]:
    """The caller's bounds (``to_txid``/``to_txids``); a partition it gives none for reads nothing."""
    return {
        p: _wanted_end(options, p) if options.to_txid is not None or p in options.to_txids else NO_TRANSACTION
        for p in partitions
    }


def partition_ids(options: ReadOptions) -> list[int]:
    """The partitions the options cover."""
    if options.over_network:
        assert options.cluster is not None
        found = network_reader.discover(options.cluster, options.partitions, bounds={}).partitions
        return [p for p in sorted(found) if options.selects(p)]
    return sorted(found_replicas(options))


def plan(options: ReadOptions, bounds: Mapping[int, int] | None = None) -> list[PartitionPlan]:
    """The read plan; ``bounds`` (txids that were committed, e.g. a stream's end offsets) cap it.

    Over the network they save asking the servers only when the replicas' low-water marks
    cover them; otherwise the servers' committed marks cap them too. A stream's end offsets may
    come from a checkpoint written before the log was rolled back (a store restored from a
    backup): past the committed mark of now, a replica may hold records that are not committed
    (a new session's appends in flight), and they must not be read as if they were."""
    if options.over_network:
        return _network_plan(options, bounds)
    return _local_plan(options, bounds)


def _range(options: ReadOptions, partition_id: int, first_held: int, bound: int) -> tuple[int, int]:
    start = max(options.from_txids.get(partition_id, options.from_txid), first_held, 0)
    end = min(_wanted_end(options, partition_id), bound)
    return start, max(end, start - 1)


def _network_plan(options: ReadOptions, bounds: Mapping[int, int] | None) -> list[PartitionPlan]:
    cluster = options.cluster
    assert cluster is not None
    if bounds is not None:
        # Bounds like the reader's own to_txids: not trusted past the replicas' low-water marks
        # (the bounds may be stale, see plan), the servers' committed marks cap them otherwise.
        bounded = sorted(p for p in bounds if options.partitions is None or p in options.partitions)
        options = replace(
            options,
            partitions=tuple(bounded),
            to_txids={p: min(bounds[p], _wanted_end(options, p)) for p in bounded},
        )
    wanted = options.partitions
    if options.partition_filter is not None:
        # Only what the filters select is asked about (an empty selection reads nothing).
        every = wanted if wanted is not None else range(network_reader.partition_count(cluster))
        wanted = tuple(p for p in every if options.selects(p))
        if not wanted:
            return []
    if options.to_txid is not None or options.to_txids:
        # The reader's own bound saves asking the servers when the replicas' low-water marks
        # (committed, as a server wrote them) already cover it; otherwise the servers say.
        every = wanted if wanted is not None else range(network_reader.partition_count(cluster))
        if options.to_txid is not None or set(every) <= set(options.to_txids):
            given = _given_bounds(options, list(every))
            layout = network_reader.discover(cluster, wanted, given, bounds_read_before=False)
            with contextlib.suppress(network_reader.NetworkReadError):
                return _network_partitions(options, layout, BOUND_GIVEN)
    layout = network_reader.discover(cluster, wanted)
    return _network_partitions(options, layout, BOUND_SERVER)


def _network_partitions(
    options: ReadOptions, layout: network_reader.ClusterLayout, source: str
) -> list[PartitionPlan]:
    result = []
    for partition_id, sources in sorted(layout.partitions.items()):
        start, end = _range(options, partition_id, 0, sources.committed)
        # Retention removed what is below the retained start on every replica: the log starts there.
        start = max(start, sources.retained_start)
        parts: tuple[Slice, ...]
        if options.tier_url is None:
            parts = tuple(sources.slices(start, end))
        else:
            parts = tuple(tier_slices(options.tier_url, sources, start, end))
        result.append(PartitionPlan(partition_id, start, end, source, parts))
    return result


def _local_plan(options: ReadOptions, bounds: Mapping[int, int] | None) -> list[PartitionPlan]:
    replicas = found_replicas(options)
    source = BOUND_GIVEN
    if options.cluster is not None:
        marks = committed_high_water_marks(options.cluster, sorted(replicas))
        if bounds is None:
            bounds, source = marks, BOUND_SERVER
        else:  # maybe stale (see plan): the files may hold records that are not committed now
            bounds = {p: min(b, marks.get(p, NO_TRANSACTION)) for p, b in bounds.items()}
    if bounds is None:
        bounds = _given_bounds(options, sorted(replicas))
    result = []
    for partition_id in sorted(replicas):
        replica = choose_replica(replicas[partition_id])
        # A bound beyond the chosen copy's log cannot be read from these files.
        bound = min(bounds.get(partition_id, NO_TRANSACTION), replica.max_txid)
        start, end = _range(options, partition_id, replica.first_txid, bound)
        result.append(PartitionPlan(partition_id, start, end, source, tuple(slices(replica, start, end))))
    return result
