"""The simulator's network: connections between named hosts, in memory, with faults.

Each node gets its view, :meth:`SimNetwork.node` (a :class:`waltz_engine.net.transport.Network`
that connects from that host). A connection is a pair of :class:`SimTransport`\\ s; the bytes a
side writes reach the other side's protocol after the link's latency, through the loop's timers
and in order (TCP never reorders). TLS is off. Faults, between any two hosts:

- latency (a distribution per link) and slow links (a factor on it);
- a partition (both ways) or one-way loss: bytes written across it stall, and a connection whose
  bytes stay stalled for :data:`STALL_RESET_S` is reset, as TCP gives up; a heal within that time
  delivers them, in order; a new connection across it times out;
- a reset of every connection between two hosts (both sides see ``ConnectionResetError``).

Flow control is TCP's: bytes written and not yet taken by the peer's protocol (in flight, or
held while the peer does not read) count in the writer's buffer, and above its high-water mark
the writer is paused.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import errno
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from waltz_engine.net.transport import PRINCIPAL_EXTRA, ProtocolFactory, ServerHandle, StreamReader
from waltz_engine.sim.loop import SimLoop

# A connection whose bytes cannot cross for this long is reset (TCP retransmits for minutes;
# every timeout of the product is shorter, so only the order of events matters here).
STALL_RESET_S = 15.0
# A connect across a partition gets no answer for this long, then fails.
CONNECT_STALL_S = STALL_RESET_S
# Local ports of outgoing connections (and of listeners on port 0) start here.
FIRST_EPHEMERAL_PORT = 40_000
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
DEFAULT_WRITE_HIGH_BYTES = 64 * 1024


@dataclass(frozen=True)
class Latency:
    """One way's delay of a link: uniform in [min_s, max_s], plus a rare spike of ``spike_s``."""

    min_s: float = 0.000_1
    max_s: float = 0.001
    spike_probability: float = 0.0
    spike_s: float = 0.0

    def sample_s(self, rng: random.Random) -> float:
        delay_s = rng.uniform(self.min_s, self.max_s)
        if self.spike_probability and rng.random() < self.spike_probability:
            delay_s += self.spike_s
        return delay_s


@dataclass
class _Link:
    """One direction between two hosts."""

    latency: Latency
    slow_factor: float = 1.0
    blocked: bool = False
    # Blocked without TCP giving up: a frozen peer (a stalled VM, a long GC pause) whose
    # connections outlive any stall, so its bytes arrive whenever it thaws.
    frozen: bool = False


@dataclass
class _SimSocket:
    address: tuple[str, int]

    def getsockname(self) -> tuple[str, int]:
        return self.address


_EOF = b""  # in a delivery queue: the peer closed its side (an empty write is never queued)


class SimTransport(asyncio.Transport):
    """One side of a simulated connection."""

    def __init__(self, network: SimNetwork, local: tuple[str, int], remote: tuple[str, int]) -> None:
        super().__init__()
        self._network = network
        self._loop = network.loop
        self.local = local
        self.remote = remote
        self.peer: SimTransport | None = None
        self._protocol: asyncio.BaseProtocol | None = None
        self._closing = False  # no more writes
        self._lost = False  # the protocol was told; nothing more arrives
        self._dead = False  # aborted or reset: nothing more leaves
        self._reading = True
        self._inbox: list[bytes] = []  # arrived while reading was paused
        self._stalled: list[bytes] = []  # written while the link was blocked
        self._stall_timer: asyncio.TimerHandle | None = None
        self._last_arrival_s = 0.0
        # Sent and not yet arrived, in order (None: a reset). Timers of one time may fire in any
        # order; each delivers the oldest, so the stream stays in order.
        self._in_flight: collections.deque[bytes | None] = collections.deque()
        self._buffered = 0
        self._high = DEFAULT_WRITE_HIGH_BYTES
        self._low = DEFAULT_WRITE_HIGH_BYTES // 4
        self._writing_paused = False
        # Who the other end is (SimNetwork.principals): the simulator's stand-in for the peer's
        # certificate, read where a TLS connection's would be (net.transport.peer_identity).
        self.peer_principal: str | None = None
        # Bytes this side sends are taken by the peer's host's code.
        self._peer_context = self._loop.host_context(remote[0])

    # asyncio.Transport

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == PRINCIPAL_EXTRA:
            return self.peer_principal
        return {"peername": self.remote, "sockname": self.local}.get(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        self._reading = True
        while self._inbox and self._reading and not self._lost:
            self._take(self._inbox.pop(0))

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = DEFAULT_WRITE_HIGH_BYTES if high is None else high
        self._low = self._high // 4 if low is None else low

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        return self._buffered

    def can_write_eof(self) -> bool:
        return False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        chunk = bytes(data)
        self._buffered += len(chunk)
        self._send(chunk)
        if not self._writing_paused and self._buffered > self._high:
            self._writing_paused = True
            self._stream_protocol().pause_writing()

    def close(self) -> None:
        """Unsent bytes still go, then the peer reads the end of the stream."""
        if self._closing:
            return
        self._closing = True
        self._send(_EOF)
        self._loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        """Gone at once, unsent bytes dropped; the peer sees a reset after the bytes sent before."""
        if self._dead:
            return
        self._dead = self._closing = True
        self._stalled.clear()
        if self.peer is not None and not self._link().blocked:
            self._in_flight.append(None)
            self._loop.call_at(self._arrival_s(), self._deliver_next, context=self._peer_context)
        self._loop.call_soon(self._connection_lost, None)

    # Moving bytes.

    def _stream_protocol(self) -> asyncio.Protocol:
        protocol = self._protocol
        assert isinstance(protocol, asyncio.Protocol)
        return protocol

    def _link(self) -> _Link:
        return self._network.link(self.local[0], self.remote[0])

    def _arrival_s(self) -> float:
        """When what is sent now arrives: after the link's delay, never before what was sent earlier."""
        link = self._link()
        delay_s = link.latency.sample_s(self._network.rng) * link.slow_factor
        self._last_arrival_s = max(self._loop.time() + delay_s, self._last_arrival_s)
        return self._last_arrival_s

    def _send(self, chunk: bytes) -> None:
        if self._dead:
            return
        link = self._link()
        if self._stalled or link.blocked:
            self._stalled.append(chunk)
            if self._stall_timer is None and not link.frozen:
                self._stall_timer = self._loop.call_later(
                    self._network.stall_reset_s, self._network.reset_connection, self, "stalled"
                )
            return
        self._in_flight.append(chunk)
        self._loop.call_at(self._arrival_s(), self._deliver_next, context=self._peer_context)

    def _deliver_next(self) -> None:
        chunk = self._in_flight.popleft()
        peer = self.peer
        assert peer is not None
        if chunk is None:
            peer._reset("the peer aborted the connection")
        else:
            peer._arrive(chunk)

    def unstall(self) -> None:
        """The link is open again: the stalled bytes go on, in order."""
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        stalled, self._stalled = self._stalled, []
        for chunk in stalled:
            self._send(chunk)
        if self._lost:
            self._network.forget(self)

    def _arrive(self, chunk: bytes) -> None:
        peer = self.peer
        if self._lost:
            # Bytes for a closed socket: TCP answers with a reset.
            if chunk and peer is not None and not peer._lost:
                self._loop.call_later(
                    self._link().latency.max_s,
                    peer._reset,
                    "the peer closed the connection",
                    context=self._loop.host_context(peer.local[0]),
                )
            return
        if self._reading and not self._inbox:
            self._take(chunk)
        else:
            self._inbox.append(chunk)

    def _take(self, chunk: bytes) -> None:
        peer = self.peer
        if peer is not None:
            peer._taken(len(chunk))
        protocol = self._stream_protocol()
        if not chunk:
            if not protocol.eof_received():
                self.close()
            return
        protocol.data_received(chunk)

    def _taken(self, size_bytes: int) -> None:
        self._buffered -= size_bytes
        if self._writing_paused and self._buffered <= self._low and not self._lost:
            self._writing_paused = False
            self._stream_protocol().resume_writing()

    def reset(self, reason: str) -> None:
        """Both ends of the connection see ``ConnectionResetError`` at once."""
        for end in (self, self.peer):
            if end is not None:
                end._reset(reason)

    def power_off(self) -> None:
        """This side's machine died: nothing more leaves or is taken here, and nobody is told
        (the peer learns only from a reset once the host is back, or its own timeouts)."""
        self._dead = self._closing = self._lost = True
        self._stalled.clear()
        self._inbox.clear()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _reset(self, reason: str) -> None:
        self._dead = self._closing = True
        self._stalled.clear()
        self._connection_lost(ConnectionResetError(errno.ECONNRESET, f"connection reset ({reason})"))

    def _connection_lost(self, error: Exception | None) -> None:
        if self._stall_timer is not None and not self._stalled:
            self._stall_timer.cancel()
            self._stall_timer = None
        if not self._stalled:
            self._network.forget(self)
        if self._lost:
            return
        self._lost = self._closing = True
        if self._protocol is not None:
            self._protocol.connection_lost(error)


class SimServer:
    """A listening port of a simulated host."""

    def __init__(self, network: SimNetwork, address: tuple[str, int], factory: ProtocolFactory) -> None:
        self._network = network
        self.address = address
        self.factory = factory
        self.serving = True

    @property
    def sockets(self) -> Sequence[Any]:
        return (_SimSocket(self.address),) if self.serving else ()

    def close(self) -> None:
        if self.serving:
            self.serving = False
            self._network.unlisten(self)

    async def wait_closed(self) -> None:
        return None


class SimNodeNetwork:
    """One host's view of the simulated network: what its node is constructed with."""

    tls = False

    def __init__(self, network: SimNetwork, host: str) -> None:
        self._network = network
        self.host = host

    @property
    def principal(self) -> str | None:
        """The host's identity on this network (None: anonymous, as a client without a certificate)."""
        return self._network.principals.get(self.host)

    async def open_connection(
        self, host: str, port: int, ssl_context: Any, limit: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if ssl_context is not None:
            raise ValueError("the simulated network carries no TLS: build nodes with ssl_context None")
        transport = await self._network.connect(self.host, (host, port))
        loop = self._network.loop
        reader = StreamReader(limit=limit, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    def is_local_host(self, host: str) -> bool:
        """Only the host's own name (never the machine's resolver: a run is a function of its seed)."""
        return host == self.host

    async def create_server(self, protocol_factory: ProtocolFactory, host: str, port: int) -> ServerHandle:
        if host not in WILDCARD_HOSTS and host != self.host:
            raise OSError(errno.EADDRNOTAVAIL, f"{self.host} cannot listen on {host}:{port}")
        return self._network.listen(self.host, port, protocol_factory)


class SimNetwork:
    """The hosts' links, listeners and open connections; faults are its methods."""

    def __init__(
        self, loop: SimLoop, latency: Latency | None = None, stall_reset_s: float = STALL_RESET_S
    ) -> None:
        self.loop = loop
        self.latency = latency if latency is not None else Latency()
        self.stall_reset_s = stall_reset_s
        self._links: dict[tuple[str, str], _Link] = {}
        self._listeners: dict[tuple[str, int], SimServer] = {}
        # Walked in the order connections opened (insertion order), never in an order of identities.
        self._open: dict[int, SimTransport] = {}
        self._next_port = FIRST_EPHEMERAL_PORT
        # Each host's principal, carried with every connection it opens or accepts (issue 34).
        self.principals: dict[str, str] = {}

    @property
    def rng(self) -> random.Random:
        return self.loop.rng

    def node(self, host: str) -> SimNodeNetwork:
        return SimNodeNetwork(self, host)

    def link(self, source: str, destination: str) -> _Link:
        link = self._links.get((source, destination))
        if link is None:
            link = self._links[(source, destination)] = _Link(self.latency)
        return link

    def _port(self) -> int:
        self._next_port += 1
        return self._next_port

    def listen(self, host: str, port: int, factory: ProtocolFactory) -> SimServer:
        address = (host, port or self._port())
        if address in self._listeners:
            raise OSError(errno.EADDRINUSE, f"{address[0]}:{address[1]} is in use")
        server = self._listeners[address] = SimServer(self, address, factory)
        self.loop.record("net", f"listen {address[0]}:{address[1]}")
        return server

    def unlisten(self, server: SimServer) -> None:
        self._listeners.pop(server.address, None)
        self.loop.record("net", f"unlisten {server.address[0]}:{server.address[1]}")

    async def connect(self, source: str, address: tuple[str, int]) -> SimTransport:
        host, port = address
        there, back = self.link(source, host), self.link(host, source)
        if there.blocked or back.blocked:
            self.loop.record("net", f"connect {source} -> {host}:{port} stalls")
            await asyncio.sleep(CONNECT_STALL_S)
            raise TimeoutError(errno.ETIMEDOUT, f"connect to {host}:{port} timed out")
        rtt_s = there.latency.sample_s(self.rng) * there.slow_factor
        rtt_s += back.latency.sample_s(self.rng) * back.slow_factor
        await asyncio.sleep(rtt_s)
        server = self._listeners.get(address)
        if server is None:
            self.loop.record("net", f"connect {source} -> {host}:{port} refused")
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"connect to {host}:{port} refused")
        local = (source, self._port())
        client, accepted = SimTransport(self, local, address), SimTransport(self, address, local)
        client.peer, accepted.peer = accepted, client
        client.peer_principal, accepted.peer_principal = (
            self.principals.get(host),
            self.principals.get(source),
        )
        for transport in (client, accepted):
            self._open[id(transport)] = transport
        protocol = server.factory()
        accepted.set_protocol(protocol)
        self.loop.call_soon(protocol.connection_made, accepted, context=self.loop.host_context(host))
        self.loop.record("net", f"connect {source}:{local[1]} -> {host}:{port}")
        return client

    def forget(self, transport: SimTransport) -> None:
        self._open.pop(id(transport), None)

    def _between(self, a: str, b: str) -> list[SimTransport]:
        return [t for t in self._open.values() if {t.local[0], t.remote[0]} == {a, b}]

    def reset_connection(self, transport: SimTransport, reason: str) -> None:
        """Both sides of one connection see a reset."""
        self.loop.record("net", f"reset {transport.local[0]}:{transport.local[1]} ({reason})")
        transport.reset(reason)

    # Faults.

    def reset(self, a: str, b: str) -> None:
        """Reset every open connection between hosts ``a`` and ``b``."""
        self.loop.record("fault", f"reset {a} <-> {b}")
        for transport in self._between(a, b):
            if not transport._lost and not transport._link().frozen:  # no RST crosses a freeze
                self.reset_connection(transport, "fault")

    def set_latency(self, a: str, b: str, latency: Latency) -> None:
        self.loop.record("fault", f"latency {a} <-> {b}: {latency}")
        for source, destination in ((a, b), (b, a)):
            self.link(source, destination).latency = latency

    def slow(self, a: str, b: str, factor: float) -> None:
        assert factor > 0
        self.loop.record("fault", f"slow {a} <-> {b} x{factor}")
        for source, destination in ((a, b), (b, a)):
            self.link(source, destination).slow_factor = factor

    def drop(self, source: str, destination: str) -> None:
        """One-way loss: bytes from ``source`` to ``destination`` stop crossing."""
        self.loop.record("fault", f"drop {source} -> {destination}")
        self.link(source, destination).blocked = True

    def power_off(self, host: str) -> None:
        """``host``'s machine dies: its listeners and its sides of connections vanish silently
        (until the world cuts its links, bytes sent to it meet a dead socket and are reset)."""
        self.loop.record("fault", f"power off {host}")
        for address in [a for a in self._listeners if a[0] == host]:
            self._listeners.pop(address).serving = False
        for transport in list(self._open.values()):
            if transport.local[0] == host:
                transport.power_off()
            elif transport.remote[0] == host:
                # Bytes for the dead side are met by no code of it: a reset, once they can cross.
                transport._peer_context = contextvars.Context()

    def freeze(self, a: str, b: str) -> None:
        """Both ways blocked, and no connection between them is ever reset for it: what either
        sent arrives when the link heals, however late."""
        self.loop.record("fault", f"freeze {a} <-> {b}")
        for source, destination in ((a, b), (b, a)):
            link = self.link(source, destination)
            link.blocked = link.frozen = True

    def partition(self, a: str, b: str) -> None:
        self.loop.record("fault", f"partition {a} <-> {b}")
        self.link(a, b).blocked = self.link(b, a).blocked = True

    def heal(self, a: str, b: str) -> None:
        """Links between ``a`` and ``b`` as new: unblocked (stalled bytes go on), usual speed; a
        frozen link stays frozen (another fault's end does not end a freeze: :meth:`thaw` does)."""
        self.loop.record("fault", f"heal {a} <-> {b}")
        for source, destination in ((a, b), (b, a)):
            frozen = self.link(source, destination).frozen
            self._links[(source, destination)] = _Link(self.latency, blocked=frozen, frozen=frozen)
        for transport in self._between(a, b):
            if not transport._link().frozen:
                transport.unstall()

    def thaw(self, a: str, b: str) -> None:
        """A freeze between ``a`` and ``b`` ends: what was sent across goes on, in order."""
        for source, destination in ((a, b), (b, a)):
            self.link(source, destination).frozen = False
        self.heal(a, b)
