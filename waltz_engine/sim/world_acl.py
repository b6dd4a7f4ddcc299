"""The simulated world with ACLs on (``WorldShape.acl``, issue 34): who each host is, the
nodes' authorizer keys and the grants (a part of :mod:`waltz_engine.sim.world`)."""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient

from waltz_engine.sim.world_constants import CLIENT_HOST, OPERATOR_HOST, ROGUE_HOST

if TYPE_CHECKING:
    from waltz_engine.sim.world import WorldShape

# Who each host is (the nodes share one principal, as a dev cluster's do).
SIM_NODE_PRINCIPAL = "CN=node,O=sim"
SIM_OPERATOR_PRINCIPAL = "CN=operator,O=sim"
SIM_CLIENT_PRINCIPAL = "CN=client,O=sim"
SIM_ROGUE_PRINCIPAL = "CN=rogue,O=sim"
# A partition the client may use, one it may only read, one refused.
ACL_MIN_PARTITIONS = 3


def acl_keys(acl: bool, prefix: str) -> dict[str, Any]:
    """A node's authorizer keys with ``acl``: no TLS here, so the trust store is never read."""
    if not acl:
        return {}
    return {
        "authorizer.enabled": True,
        "authorizer.nodePrincipals": [SIM_NODE_PRINCIPAL],
        "authorizer.audit.log": "",
        f"{prefix}.ssl.trustStore.location": "unused: the simulated network carries no TLS",
    }


def grant(
    zk: KazooClient,
    cluster_root: str,
    shape: WorldShape,
    principals: MutableMapping[str, str],
    storage_hosts: Sequence[str],
) -> None:
    """The hosts' principals and the ACLs of ``WorldShape.acl``."""
    from waltz_engine.auth.acl import change_acls, make_entries

    partitions = shape.partitions
    assert partitions >= ACL_MIN_PARTITIONS, "acl needs a partition to use, one to read, one refused"
    for host in [*storage_hosts, *(f"server-{n}" for n in range(shape.servers))]:
        principals[host] = SIM_NODE_PRINCIPAL
    principals[OPERATOR_HOST] = SIM_OPERATOR_PRINCIPAL
    principals[CLIENT_HOST] = SIM_CLIENT_PRINCIPAL
    principals[ROGUE_HOST] = SIM_ROGUE_PRINCIPAL
    entries = [
        # The export-style read of the replicas (admin port) is a read, as an export's is.
        *make_entries(SIM_OPERATOR_PRINCIPAL, ["admin", "read"], "*", deny=False),
        *make_entries(SIM_CLIENT_PRINCIPAL, ["read"], f"0-{partitions - 2}", deny=False),
        *make_entries(SIM_CLIENT_PRINCIPAL, ["append"], f"0-{partitions - 3}", deny=False),
    ]
    change_acls(zk, cluster_root, entries)
