"""Repairs run from a tool: an offline tail cut (``truncate``) and a store session now (``recover``)."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any, NamedTuple

from kazoo.client import KazooClient

from waltz_engine.common.address import HostPort
from waltz_engine.common.errors import WaltzError
from waltz_engine.ops.cluster_ops.servers import check_partition_in_cluster
from waltz_engine.ops.cluster_ops.view import NO_TRANSACTION, ClusterOpsError
from waltz_engine.storage import admin_ops
from waltz_engine.storage.admin_ops import StorageAdminError, StorageContext
from waltz_engine.zk import store_metadata

# --- truncate (offline) ------------------------------------------------------------------------------


class TruncateResult(NamedTuple):
    partition_id: int
    storage: str  # host:data_port
    session_id: int
    low_water_mark: int
    old_max_transaction_id: int
    new_max_transaction_id: int
    forced: bool

    @property
    def removed(self) -> int:
        return self.old_max_transaction_id - self.new_max_transaction_id

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition_id,
            "storage": self.storage,
            "session_id": self.session_id,
            "low_water_mark": self.low_water_mark,
            "old_max_transaction_id": self.old_max_transaction_id,
            "new_max_transaction_id": self.new_max_transaction_id,
            "removed": self.removed,
            "forced": self.forced,
        }


async def truncate_partition(
    context: StorageContext,
    admin_address: HostPort,
    data_port: int,
    partition_id: int,
    to_transaction_id: int,
    *,
    force: bool = False,
) -> TruncateResult:
    """Cut a replica's tail after ``to_transaction_id``, offline (the partition must be
    unavailable on the node), never below its low-water mark unless ``force``.

    Uses a data-port client in offline-recovery mode with the node's last session id, as the
    original's offline recovery does; TRUNCATE answers the new max transaction id.
    """
    context.check_partitions([partition_id])
    if to_transaction_id < NO_TRANSACTION:
        raise ClusterOpsError(
            f"--to must be {NO_TRANSACTION} (empty) or a transaction id, got {to_transaction_id}"
        )
    data_address = HostPort(admin_address.host, data_port)
    fail = f"Failed to truncate partition {partition_id} on {data_address}"
    try:
        async with admin_ops.admin_client(context, admin_address) as admin:
            status = await admin.assigned_partition_status()
            info = await admin.last_session_info(partition_id)
        if partition_id not in status:
            raise ClusterOpsError(f"{fail}: the partition is not assigned to that storage node")
        if status[partition_id]:
            raise ClusterOpsError(
                f"{fail}: the partition is available (online) there; make it unavailable first: "
                f"waltz storage availability -s {admin_address} -p {partition_id} --offline"
            )
        if to_transaction_id < info.low_water_mark and not force:
            raise ClusterOpsError(
                f"{fail}: {to_transaction_id} is below the replica's low-water mark {info.low_water_mark} "
                f"(transactions up to it were committed); use --force to cut anyway"
            )
        async with admin_ops.data_client(context, data_address, used_by_offline_recovery=True) as data:
            old_max = await data.max_transaction_id(info.session_id, partition_id)
            new_max = await data.truncate(info.session_id, partition_id, to_transaction_id)
    except (StorageAdminError, ClusterOpsError):
        raise
    except (WaltzError, OSError, TimeoutError) as e:
        raise ClusterOpsError(f"{fail}: {str(e) or type(e).__name__}") from None
    assert new_max <= old_max, "TRUNCATE never adds transactions"
    return TruncateResult(
        partition_id, str(data_address), info.session_id, info.low_water_mark, old_max, new_max, force
    )


# --- recover (a store session from this process) -----------------------------------------------------

DEFAULT_RECOVER_TIMEOUT_S = 60.0
# After the session opens (a quorum recovered), the other reachable replicas finish recovery in
# the background; polled this often, until all did or the timeout.
REPLICA_POLL_INTERVAL_S = 0.05


def _all_replicas_recovered(status: dict[str, Any]) -> bool:
    session = status.get("session")
    replicas = session.get("replicas", []) if isinstance(session, dict) else []
    return all(r.get("max_transaction_id") is not None for r in replicas)


async def _wait_for_replicas(partition: Any, deadline: float) -> None:
    loop = asyncio.get_running_loop()
    while not _all_replicas_recovered(partition.status()) and loop.time() < deadline:
        await asyncio.sleep(REPLICA_POLL_INTERVAL_S)


class RecoverResult(NamedTuple):
    partition_id: int
    generation: int
    session_id: int | None
    high_water_mark: int
    status: dict[str, Any]  # StorePartition.status(): the session and each replica's state

    @property
    def replicas(self) -> list[dict[str, Any]]:
        session = self.status.get("session")
        return list(session.get("replicas", [])) if isinstance(session, dict) else []

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition_id,
            "generation": self.generation,
            "session_id": self.session_id,
            "high_water_mark": self.high_water_mark,
            "status": self.status,
        }


async def recover_partition(
    client: KazooClient,
    root: str,
    partition_id: int,
    ssl_context: ssl.SSLContext,
    *,
    timeout_s: float = DEFAULT_RECOVER_TIMEOUT_S,
) -> RecoverResult:
    """Open a new store session for a partition in this process, which runs recovery now.

    The session takes the partition's current generation from ``store/partition/<P>`` and the
    next session id, so the owning server's session is fenced: the server opens a new one
    (running recovery again) on its next use. Returns the resolved high-water mark and each
    replica's state; the session is closed before returning.
    """
    # Imported here: the store layer is large and only this operation needs it.
    from waltz_engine.server.store import Store, StoreConfig, StoreError

    if timeout_s <= 0:
        raise ClusterOpsError(f"timeout must be positive, got {timeout_s} s")
    check_partition_in_cluster(client, root, partition_id)
    generation = store_metadata.read_partition_metadata(client, root, partition_id).metadata.generation
    store = Store(client, root, ssl_context, StoreConfig())
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        await store.start()
        partition = store.partition(partition_id)
        await partition.set_generation(generation)
        try:
            async with asyncio.timeout(timeout_s):
                await partition.ensure_open()
        except TimeoutError:
            raise ClusterOpsError(
                f"Recovery of partition {partition_id} did not finish within {timeout_s:g} s "
                f"(a quorum of its replicas must be reachable): {json.dumps(partition.status(), default=str)}"
            ) from None
        # Closing now would abort the replicas still recovering: give them the time left.
        await _wait_for_replicas(partition, deadline)
        status = dict(partition.status())
        session = status.get("session")
        session_id = session.get("session_id") if isinstance(session, dict) else None
        return RecoverResult(
            partition_id,
            generation,
            session_id if isinstance(session_id, int) else None,
            partition.high_water_mark,
            status,
        )
    except StoreError as e:
        raise ClusterOpsError(f"Recovery of partition {partition_id} failed: {e}") from None
    finally:
        await store.close()
