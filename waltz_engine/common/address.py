"""``host:port``: the one type for a node's address (a storage node's data or admin port, a
server's client or HTTP port) and its one parser, refusing bad values in the original tools'
words (``Storage must be in format of host:port, got 'x'``)."""

from __future__ import annotations

import errno
import socket
from typing import NamedTuple

from waltz_engine.common.errors import WaltzError

MIN_PORT = 1
MAX_PORT = 65_535


class AddressError(WaltzError):
    """A ``host:port`` value is malformed."""


class HostPort(NamedTuple):
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def port_in_use(host: str, port: int) -> bool:
    """Whether another socket listens on ``host:port``. Binds with SO_REUSEADDR, as our nodes and
    ZooKeeper do, so a port in TIME_WAIT counts as free; any other bind error is raised."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def is_port(port: int) -> bool:
    return MIN_PORT <= port <= MAX_PORT


def parse_host_port(text: str, what: str = "Storage", form: str = "host:port") -> HostPort:
    """``host:port`` (no scheme, no IPv6 brackets, as the original's connect strings); anything
    else raises ``<what> must be in format of <form>, got '<text>'``."""
    host, separator, port = text.partition(":")
    if not separator or not host or ":" in port or not port.isdigit() or not is_port(int(port)):
        raise AddressError(f"{what} must be in format of {form}, got '{text}'")
    return HostPort(host, int(port))
