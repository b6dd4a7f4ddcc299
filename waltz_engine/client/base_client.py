"""What the stream and RPC clients share: one network client per server, partitions mapped to them.

The original's ``InternalBaseClient``: endpoints and generations come from the cluster
manager; a partition is *mounted* on the network client of the server that owns it once that
client's connection is up, and moved when the assignment changes or the connection drops.
Reconnects to one endpoint share one backoff (:mod:`waltz_engine.client.backoff`), reset by
:meth:`BaseClient.connection_proved` once a connection did what it was opened for.

Every network client of one client takes the next ``seq_num``, never one used before: a server
keeps the MOUNT of the newest (generation, seq_num) and ignores the others (PR #167), so a
connection opened after its server left the cluster and came back must outrank the one before,
whose end the server may not have read yet. The original starts such a client at 0 again, and its
mounts went unanswered for good (the simulator's seed 233).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod

from waltz_engine.client.backoff import RECONNECT_BACKOFF_MAX_MS, reconnect_backoff
from waltz_engine.client.errors import ClientTlsRefusedError
from waltz_engine.client.network_client import Endpoint, NetworkClient, OpenChannel
from waltz_engine.client.unfinished import Unfinished
from waltz_engine.common.backoff import Backoff
from waltz_engine.wire.client_messages import ClientMessage
from waltz_engine.zk.payloads import PartitionInfo

log = logging.getLogger(__name__)

FIRST_SEQ_NUM = 1
NO_GENERATION = -1


class BaseClient(ABC):
    def __init__(
        self,
        open_channel: OpenChannel,
        reconnect_delay_ms: int,
        reconnect_max_delay_ms: int = RECONNECT_BACKOFF_MAX_MS,
    ) -> None:
        self._open_channel = open_channel
        self._reconnect_delay_ms = reconnect_delay_ms
        self._reconnect_max_delay_ms = max(reconnect_max_delay_ms, reconnect_delay_ms)
        self._backoffs: dict[Endpoint, Backoff] = {}
        self.reconnects = 0  # connections replaced after a drop (metrics, tests)
        self._network_clients: dict[Endpoint, NetworkClient] = {}
        self._last_seq_num = FIRST_SEQ_NUM - 1
        self._assigned: dict[int, NetworkClient] = {}
        self._generations: dict[int, int] = {}
        self._closing: set[asyncio.Task[None]] = set()  # the loop keeps only weak references
        self._closed = False

    # -- hooks -----------------------------------------------------------------------------

    @abstractmethod
    def _on_assigned(self, partition_id: int, network_client: NetworkClient | None) -> None:
        """``partition_id`` now belongs to ``network_client`` (None: to no server we know)."""

    @abstractmethod
    def _on_mountable(self, network_client: NetworkClient, partition_id: int) -> None:
        """``network_client`` is connected and owns ``partition_id``: mount it."""

    @abstractmethod
    async def on_message(self, network_client: NetworkClient, message: ClientMessage) -> None: ...

    async def on_messages(self, network_client: NetworkClient, messages: list[ClientMessage]) -> None:
        """Messages that arrived together, in order."""
        for message in messages:
            await self.on_message(network_client, message)

    # True: a connection's read callback hands each read's messages to on_messages_now.
    handles_messages_now = False

    def on_messages_now(
        self, network_client: NetworkClient, messages: list[ClientMessage]
    ) -> Unfinished | None:
        """:meth:`on_messages` as far as nothing waits, in the read callback; the rest for the
        reader task (here: all of it)."""
        return Unfinished(self.on_messages(network_client, messages))

    @abstractmethod
    def on_refused(self, network_client: NetworkClient, error: ClientTlsRefusedError) -> None:
        """The server keeps refusing this client at TLS: fail what waits on ``network_client``."""

    def connection_proved(self, network_client: NetworkClient) -> None:
        """``network_client``'s connection did its job: the next reconnect starts the backoff over."""
        backoff = self._backoffs.get(network_client.endpoint)
        if backoff is not None and backoff.attempts:
            backoff.reset()

    def _backoff(self, endpoint: Endpoint) -> Backoff:
        backoff = self._backoffs.get(endpoint)
        if backoff is None:
            backoff = self._backoffs[endpoint] = reconnect_backoff(
                self._reconnect_delay_ms, self._reconnect_max_delay_ms
            )
        return backoff

    # -- cluster changes -------------------------------------------------------------------

    def generation(self, partition_id: int) -> int:
        return self._generations.get(partition_id, NO_GENERATION)

    def network_client_of(self, partition_id: int) -> NetworkClient | None:
        return self._assigned.get(partition_id)

    def set_endpoints(self, endpoints: dict[Endpoint, list[PartitionInfo]]) -> None:
        if self._closed:
            return
        wanted: dict[int, tuple[Endpoint, int]] = {}
        for endpoint, partitions in endpoints.items():
            for info in partitions:
                wanted[info.partition_id] = (endpoint, info.generation)
        for partition_id, (endpoint, generation) in wanted.items():
            old_generation = self.generation(partition_id)
            self._generations[partition_id] = max(old_generation, generation)
            network_client = self._network_client_for(endpoint)
            if self._assigned.get(partition_id) is not network_client or generation > old_generation:
                self._assign(partition_id, network_client)
        for partition_id in [p for p in self._assigned if p not in wanted]:
            del self._assigned[partition_id]
            self._on_assigned(partition_id, None)
        for endpoint in [e for e in self._network_clients if e not in endpoints]:
            self._drop_network_client(endpoint)
            self._backoffs.pop(endpoint, None)

    def remove_server(self, endpoint: Endpoint) -> None:
        """A server left the cluster: its partitions wait for the next assignment."""
        if endpoint in self._network_clients:
            for partition_id in [p for p, nc in self._assigned.items() if nc.endpoint == endpoint]:
                del self._assigned[partition_id]
                self._on_assigned(partition_id, None)
            self._drop_network_client(endpoint)

    def _assign(self, partition_id: int, network_client: NetworkClient) -> None:
        self._assigned[partition_id] = network_client
        self._on_assigned(partition_id, network_client)
        if network_client.ready:
            self._on_mountable(network_client, partition_id)

    def _new_network_client(self, endpoint: Endpoint) -> NetworkClient:
        self._last_seq_num += 1
        network_client = NetworkClient(
            endpoint, self._last_seq_num, self._open_channel, self, self._backoff(endpoint)
        )
        self._network_clients[endpoint] = network_client
        return network_client

    def _network_client_for(self, endpoint: Endpoint) -> NetworkClient:
        network_client = self._network_clients.get(endpoint)
        if network_client is None:
            network_client = self._new_network_client(endpoint)
            network_client.start()
        return network_client

    def _drop_network_client(self, endpoint: Endpoint) -> None:
        network_client = self._network_clients.pop(endpoint)
        # Closing awaits the reader task; nothing here needs to wait for it.
        task = asyncio.create_task(network_client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # -- network client callbacks ----------------------------------------------------------

    def on_channel_ready(self, network_client: NetworkClient) -> None:
        for partition_id, owner in list(self._assigned.items()):
            if owner is network_client:
                self._on_mountable(network_client, partition_id)

    def on_disconnected(self, network_client: NetworkClient) -> None:
        endpoint = network_client.endpoint
        if self._closed or self._network_clients.get(endpoint) is not network_client:
            return
        replacement = self._new_network_client(endpoint)
        self.reconnects += 1
        log.info("reconnecting to %s (seq %d)", endpoint, replacement.seq_num)
        for partition_id, owner in list(self._assigned.items()):
            if owner is network_client:
                self._assign(partition_id, replacement)
        replacement.start(wait_first=True)

    async def close(self) -> None:
        self._closed = True
        clients = list(self._network_clients.values())
        self._network_clients.clear()
        self._assigned.clear()
        for network_client in clients:
            await network_client.close()
