"""Restless clients (issue 13, item 5) against real processes: ZooKeeper (the session's),
one storage node and one server.

An ``apply_transaction`` that keeps raising used to make the client reconnect at once, for
ever (about 16 000 reconnects a minute); now every reconnect backs off (exponential, jittered,
capped) and after ``MAX_APPLICATION_ATTEMPTS`` tries of one transaction the client stops the
partition and says why through ``uncaught_exception``. A client the server refuses at TLS used
to retry every second and end in "no answer for the high-water mark within ... ms"; now it
says the server refused its certificate (or asked for one), before its timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from cert_support import make_cert
from client_support.app import MockCallbacks, MockContext
from cluster_support import local_cluster, module_cluster, waltz_client_config
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from waltz_engine.client import (
    ClientTlsRefusedError,
    PartitionStoppedError,
    Transaction,
    WaltzClient,
    WaltzClientConfig,
)
from waltz_engine.client.config import MAX_APPLICATION_ATTEMPTS
from waltz_engine.net.tls import TlsConfig
from waltz_engine.ops.devcluster import LocalCluster

TEST_BOUND_S = 120.0
WAIT_S = 30.0
POLL_S = 0.01
# The whole give-up (5 tries: backoff 100, 200, 400, 800 ms, jittered) takes about 1.5 s.
GIVE_UP_WITHIN_S = 10.0
QUIET_WINDOW_S = 3.0  # after giving up: no more reconnects, no more calls
MAX_RECONNECTS_PER_S = 4.0
RPC_TIMEOUT_MS = 8_000
REFUSED_WITHIN_S = 5.0  # well inside the 8 s RPC timeout
CONNECT_WINDOW_S = 4.0
MAX_CONNECTS_IN_WINDOW = 12  # 100 ms doubling to 10 s: about 6 (the old client made 1 a second each)


cluster = module_cluster(storages=1, partitions=1)


def run(test: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(test, TEST_BOUND_S))


class RaisingCallbacks(MockCallbacks):
    """An application that can never apply anything."""

    async def apply_transaction(self, transaction: Transaction) -> None:
        raise RuntimeError(f"cannot apply {transaction.transaction_id}")


async def wait_until(condition: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


def test_a_raising_callback_backs_off_then_stops_the_partition(cluster: LocalCluster) -> None:
    async def go() -> None:
        config = waltz_client_config(cluster)
        async with WaltzClient(MockCallbacks(), config) as producer:
            context = MockContext("never applied")
            await producer.submit(context)
            assert await context.result(WAIT_S)
            start_hwm = await producer.high_water_mark(0) - 1  # the consumer starts just before it

        callbacks = RaisingCallbacks({0: start_hwm})
        started = time.monotonic()
        async with WaltzClient(callbacks, config) as consumer:
            stream = consumer._stream
            assert stream is not None
            gave_up = await wait_until(
                lambda: any(isinstance(e, PartitionStoppedError) for _, _, e in callbacks.uncaught),
                GIVE_UP_WITHIN_S,
            )
            elapsed = time.monotonic() - started
            calls, reconnects = len(callbacks.uncaught), stream.reconnects
            assert gave_up, f"{calls} failed tries and {reconnects} reconnects in {elapsed:.1f} s, no give-up"
            # One call per try, the last one saying the partition stopped (the cause: the app's error).
            assert calls == MAX_APPLICATION_ATTEMPTS, callbacks.uncaught
            assert all(p == 0 and t == start_hwm + 1 for p, t, _ in callbacks.uncaught)
            stopped = callbacks.uncaught[-1][2]
            assert isinstance(stopped, PartitionStoppedError)
            assert isinstance(stopped.__cause__, RuntimeError) and "cannot apply" in str(stopped)
            assert reconnects <= MAX_APPLICATION_ATTEMPTS
            assert reconnects / max(elapsed, 1.0) <= MAX_RECONNECTS_PER_S, (reconnects, elapsed)
            # Quiet afterwards: the stopped partition is not mounted again, nothing is retried.
            await asyncio.sleep(QUIET_WINDOW_S)
            assert len(callbacks.uncaught) == calls
            assert stream.reconnects <= reconnects + 1
            assert consumer.get_partitions() == set()
            with pytest.raises(PartitionStoppedError):
                await consumer.submit(MockContext("to a stopped partition"))

    run(go())


# -- a server that checks client certificates -----------------------------------------------


def _write_pem(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> Path:
    path.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA with the storage's and the server's certificates, and a rogue self-signed client."""
    d = tmp_path_factory.mktemp("pki")
    ca_key, ca = make_cert("waltz-test-ca", None, None, True)
    (d / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out = {"ca": d / "ca.pem"}
    for who in ("storage", "server"):
        out[who] = _write_pem(d / f"{who}.pem", *make_cert(who, ca_key, ca.subject, False))
    out["rogue"] = _write_pem(d / "rogue.pem", *make_cert("rogue", None, None, False))
    return out


@pytest.fixture(scope="module")
def tls_cluster(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: str, pki: dict[str, Path]
) -> Iterator[LocalCluster]:
    """A cluster whose server accepts only clients with a certificate of the CA."""
    with local_cluster(
        tmp_path_factory,
        storages=1,
        servers=1,
        partitions=1,
        zookeeper=zookeeper,
        storage_config={"storage.ssl.keyStore.location": str(pki["storage"])},
    ) as c:
        server = c.servers[0]
        config = yaml.safe_load(server.config_path.read_text(encoding="utf-8"))
        config["server.ssl.keyStore.location"] = str(pki["server"])
        config["server.ssl.trustStore.location"] = str(pki["ca"])
        server.stop()
        server.config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        server.start()
        yield c


@pytest.mark.parametrize(
    ("certificate", "says"),
    [(None, "asked for this client's certificate"), ("rogue", "refused this client's certificate")],
)
def test_a_client_refused_at_tls_says_so_within_its_timeout(
    tls_cluster: LocalCluster, pki: dict[str, Path], certificate: str | None, says: str
) -> None:
    async def go() -> None:
        tls = TlsConfig(key_store_location=str(pki[certificate]) if certificate else None)
        config: WaltzClientConfig = replace(
            waltz_client_config(tls_cluster), tls=tls, rpc_timeout_ms=RPC_TIMEOUT_MS
        )
        async with WaltzClient(MockCallbacks(), config) as client:
            started = time.monotonic()
            with pytest.raises(ClientTlsRefusedError, match=says):
                await client.high_water_mark(0)
            assert time.monotonic() - started < REFUSED_WITHIN_S
            with pytest.raises(ClientTlsRefusedError, match=says):
                await client.submit(MockContext("refused"))
            # And it does not hammer the server: the reconnects back off.
            stream, rpc = client._stream, client._rpc
            assert stream is not None and rpc is not None

            def connects() -> int:
                clients = [*stream._network_clients.values(), *rpc._network_clients.values()]
                return sum(nc.connects for nc in clients)

            before = connects()
            await asyncio.sleep(CONNECT_WINDOW_S)
            made = connects() - before
            assert made <= MAX_CONNECTS_IN_WINDOW, f"{made} connects in {CONNECT_WINDOW_S} s"

    run(go())
