"""A restarted server ends the registration its dead predecessor left behind (issue 24 item 5).

A server registers an ephemeral znode (``serverDescriptors/s_N``) that lives as long as its
ZooKeeper session. After ``kill -9`` the session, and so the registration, outlives the process
until ZooKeeper expires it (the session timeout, 10-30 s): meanwhile its lowest server id keeps
it the coordinator that nobody is, and its partitions stay assigned to it, so appends fail with
"no server is assigned the partition".

A server that starts on the same endpoint knows better: it has bound that very host and port, so
no live process can hold them on this machine. Once registered, it removes every other
registration of its endpoint, and the coordinator moves the partitions in seconds. A registration
of another endpoint is never touched, nor one whose host is not an address of this machine (two
machines advertising one name would be a broken configuration, not a dead server).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from waltz_engine.common.errors import FormatError
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.payloads import ServerDescriptor

log = logging.getLogger(__name__)

MAX_REGISTRATIONS_READ = 10_000  # server descriptors listed at most (a bound on a hostile tree)


def remove_stale_registrations(
    client: KazooClient,
    root: str,
    own: ServerDescriptor,
    own_path: str,
    is_local_host: Callable[[str], bool],
) -> list[int]:
    """Delete the other registrations of ``own``'s endpoint (this process holds its port); the
    server ids removed. Call only once this process listens on that endpoint. ``is_local_host``:
    the node's network's answer (``Network.is_local_host``)."""
    if not is_local_host(own.host):
        return []
    paths = ClusterPaths.of(root)
    removed = []
    for child in client.get_children(paths.server_descriptors)[:MAX_REGISTRATIONS_READ]:
        path = f"{paths.server_descriptors}/{child}"
        if path == own_path or paths.kind_of(path) != "ServerDescriptor":
            continue
        try:
            data, stat = client.get(path)
            descriptor = ServerDescriptor.from_bytes(data)
        except NoNodeError:
            continue  # its session ended meanwhile
        except FormatError:
            continue  # not ours to judge
        if (descriptor.host, descriptor.port) != (own.host, own.port):
            continue
        with contextlib.suppress(NoNodeError, BadVersionError):
            client.delete(path, version=stat.version)
            removed.append(descriptor.server_id)
            log.warning(
                "removed the registration of server %d at %s:%d (%s): its process is gone, this server "
                "holds that port now; its partitions move without waiting for its session to expire",
                descriptor.server_id,
                descriptor.host,
                descriptor.port,
                child,
            )
    return removed
