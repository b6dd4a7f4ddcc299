"""TLS contexts over real loopback sockets: self-signed default, required client certs, PKCS12,
and JKS key and trust stores made by the JDK's keytool."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cert_support import make_cert
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from waltz_engine.net.tls import TlsConfig, TlsConfigError, client_context, server_context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    ca_key, ca = make_cert("test-ca", None, None, True)
    out: dict[str, Path] = {"ca": d / "ca.pem"}
    out["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for who in ("server", "client"):
        key, cert = make_cert(who, ca_key, ca.subject, False)
        pem = d / f"{who}.pem"
        pem.write_bytes(
            cert.public_bytes(serialization.Encoding.PEM)
            + key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        out[who] = pem
        p12 = d / f"{who}.p12"
        p12.write_bytes(
            pkcs12.serialize_key_and_certificates(
                who.encode(), key, cert, None, serialization.BestAvailableEncryption(b"secret")
            )
        )
        out[f"{who}_p12"] = p12
    return out


async def _exchange(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> bytes:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(await reader.readexactly(4))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx)
        writer.write(b"ping")
        await writer.drain()
        data = await asyncio.wait_for(reader.read(4), 5)
        writer.close()
        return data
    finally:
        server.close()
        await server.wait_closed()


def test_unconfigured_is_self_signed_tls() -> None:
    assert asyncio.run(_exchange(server_context(TlsConfig()), client_context(TlsConfig()))) == b"ping"


def test_trust_store_on_server_requires_a_client_certificate(pki: dict[str, Path]) -> None:
    server = server_context(
        TlsConfig(key_store_location=str(pki["server"]), trust_store_location=str(pki["ca"]))
    )
    # Without a certificate the server refuses: the exchange never echoes.
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        data = asyncio.run(_exchange(server, client_context(TlsConfig())))
        if data != b"ping":
            raise ConnectionError("no echo")
    client = client_context(
        TlsConfig(key_store_location=str(pki["client"]), trust_store_location=str(pki["ca"]))
    )
    assert asyncio.run(_exchange(server, client)) == b"ping"


def test_client_with_trust_store_rejects_an_unknown_server(pki: dict[str, Path]) -> None:
    client = client_context(TlsConfig(trust_store_location=str(pki["ca"])))
    with pytest.raises(ssl.SSLError):
        asyncio.run(_exchange(server_context(TlsConfig()), client))


def test_pkcs12_stores(pki: dict[str, Path]) -> None:
    server = server_context(
        TlsConfig(
            key_store_location=str(pki["server_p12"]),
            key_store_password="secret",
            key_store_type="PKCS12",
            trust_store_location=str(pki["ca"]),
        )
    )
    client = client_context(
        TlsConfig(
            key_store_location=str(pki["client_p12"]),
            key_store_password="secret",
            key_store_type="PKCS12",
            trust_store_location=str(pki["ca"]),
        )
    )
    assert asyncio.run(_exchange(server, client)) == b"ping"


def test_config_errors_are_one_line(pki: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(TlsConfigError, match="is a PEM file, not JKS: set its type to PEM"):
        server_context(TlsConfig(key_store_location=str(pki["server"]), key_store_type="JKS"))
    with pytest.raises(TlsConfigError, match="type 'BKS' is not supported"):
        server_context(TlsConfig(key_store_location=str(pki["server"]), key_store_type="BKS"))
    with pytest.raises(TlsConfigError, match="cannot read key store"):
        server_context(TlsConfig(key_store_location=str(tmp_path / "missing.pem")))
    with pytest.raises(TlsConfigError, match="cannot open PKCS12 key store .*password is wrong"):
        server_context(
            TlsConfig(
                key_store_location=str(pki["server_p12"]), key_store_password="bad", key_store_type="PKCS12"
            )
        )
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(TlsConfigError):
        server_context(TlsConfig(key_store_location=str(garbage)))


def test_from_flat_reads_prefixed_keys() -> None:
    cfg = TlsConfig.from_flat(
        {"storage.ssl.keyStore.location": "/k.p12", "storage.ssl.keyStore.type": "pkcs12"}, "storage"
    )
    assert cfg.key_store_location == "/k.p12" and cfg.key_store_type == "PKCS12"
    assert cfg.trust_store_location is None
    assert cfg.trust_store_type is None  # no type key: the content decides (JKS, PEM or PKCS12)


# --- JKS, as a Java cluster's ssl.* files: a CA, and a key pair signed by it for each side ---

STORE_PASSWORD = "store-secret"
KEYTOOL_TIMEOUT_S = 120
# The JVM's quick start: keytool's work is small, its start-up is most of its time.
KEYTOOL_JVM = ("-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC")


def _keytool(*args: str) -> None:
    result = subprocess.run(
        ["keytool", *KEYTOOL_JVM, *args],
        capture_output=True,
        text=True,
        timeout=KEYTOOL_TIMEOUT_S,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"keytool {' '.join(args)}:\n{result.stdout}{result.stderr}"


def _genkeypair(store: Path, alias: str, *extra: str, key_password: str = STORE_PASSWORD) -> None:
    _keytool(
        "-genkeypair", "-alias", alias, "-keyalg", "RSA", "-keysize", "2048", "-dname", f"CN={alias}",
        "-validity", "2", "-storetype", "JKS", "-keystore", str(store),
        "-storepass", STORE_PASSWORD, "-keypass", key_password, *extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def jks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ca.jks (the CA's key pair), trust.jks (the CA as a trusted certificate entry), and
    server.jks / client.jks: each a key pair whose chain is [its certificate, the CA]."""
    d = tmp_path_factory.mktemp("jks")
    out = {name: d / f"{name}.jks" for name in ("ca", "trust", "server", "client", "keypass")}
    ca_cert = d / "ca.crt"
    _genkeypair(out["ca"], "waltz-test-ca", "-ext", "bc:c", "-ext", "KeyUsage:c=keyCertSign,cRLSign")
    _keytool("-exportcert", "-rfc", "-alias", "waltz-test-ca", "-keystore", str(out["ca"]),
             "-storepass", STORE_PASSWORD, "-file", str(ca_cert))  # fmt: skip
    _keytool("-importcert", "-noprompt", "-alias", "waltz-test-ca", "-file", str(ca_cert),
             "-storetype", "JKS", "-keystore", str(out["trust"]), "-storepass", STORE_PASSWORD)  # fmt: skip
    for who in ("server", "client"):
        store, request, reply = out[who], d / f"{who}.csr", d / f"{who}.crt"
        _genkeypair(store, who)
        _keytool("-certreq", "-alias", who, "-keystore", str(store), "-storepass", STORE_PASSWORD,
                 "-file", str(request))  # fmt: skip
        _keytool("-gencert", "-rfc", "-alias", "waltz-test-ca", "-keystore", str(out["ca"]),
                 "-storepass", STORE_PASSWORD, "-validity", "2", "-infile", str(request),
                 "-outfile", str(reply))  # fmt: skip
        # The CA first (a trusted entry in the key store, as keytool needs), then the CA's reply.
        _keytool("-importcert", "-noprompt", "-alias", "waltz-test-ca", "-file", str(ca_cert),
                 "-keystore", str(store), "-storepass", STORE_PASSWORD)  # fmt: skip
        _keytool("-importcert", "-alias", who, "-file", str(reply), "-keystore", str(store),
                 "-storepass", STORE_PASSWORD)  # fmt: skip
    # A key whose password is not the store's: Java's key manager could not open it either.
    _genkeypair(out["keypass"], "other", key_password="key-secret")
    return out


def _jks_config(jks: dict[str, Path], who: str, store_type: str | None = "JKS") -> TlsConfig:
    return TlsConfig(
        key_store_location=str(jks[who]),
        key_store_password=STORE_PASSWORD,
        key_store_type=store_type,
        trust_store_location=str(jks["trust"]),
        trust_store_password=STORE_PASSWORD,
        trust_store_type=store_type,
    )


def _refused(server: ssl.SSLContext, client: ssl.SSLContext) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        if asyncio.run(_exchange(server, client)) != b"ping":
            raise ConnectionError("no echo")


def test_jks_key_and_trust_stores_on_both_sides(jks: dict[str, Path]) -> None:
    server = server_context(_jks_config(jks, "server"))
    assert server.verify_mode == ssl.CERT_REQUIRED  # a trust store: client certificates required
    client = client_context(_jks_config(jks, "client"))
    assert asyncio.run(_exchange(server, client)) == b"ping"
    # The server sent its JKS chain (leaf signed by the CA); the client sent its own.
    _refused(server, client_context(TlsConfig()))  # no client certificate
    untrusting = TlsConfig(trust_store_location=str(jks["trust"]), trust_store_password=STORE_PASSWORD)
    _refused(server_context(TlsConfig()), client_context(untrusting))  # a self-signed server


def test_jks_detected_with_no_type_key(jks: dict[str, Path]) -> None:
    """The original's default type is JKS; with no type key the content decides."""

    def flat(prefix: str, who: str) -> TlsConfig:
        return TlsConfig.from_flat(
            {
                f"{prefix}.ssl.keyStore.location": str(jks[who]),
                f"{prefix}.ssl.keyStore.password": STORE_PASSWORD,
                f"{prefix}.ssl.trustStore.location": str(jks["trust"]),
                f"{prefix}.ssl.trustStore.password": STORE_PASSWORD,
            },
            prefix,
        )

    server_config, client_config = flat("storage", "server"), flat("client", "client")
    assert server_config.key_store_type is None and client_config.trust_store_type is None
    assert asyncio.run(_exchange(server_context(server_config), client_context(client_config))) == b"ping"


def test_java_store_types_are_read_as_their_content(jks: dict[str, Path], pki: dict[str, Path]) -> None:
    """As Java's keystore.type.compat: a PKCS12 file typed JKS and a JKS file typed PKCS12 open."""
    server = server_context(
        TlsConfig(
            key_store_location=str(pki["server_p12"]),
            key_store_password="secret",
            key_store_type="JKS",
            trust_store_location=str(jks["trust"]),
            trust_store_password=STORE_PASSWORD,
            trust_store_type="PKCS12",
        )
    )
    client = client_context(
        TlsConfig(
            key_store_location=str(jks["client"]),
            key_store_password=STORE_PASSWORD,
            key_store_type="PKCS12",
            trust_store_location=str(pki["ca"]),
        )
    )
    assert asyncio.run(_exchange(server, client)) == b"ping"
    # A JKS trust store with no password (Java then skips the integrity check, and so do we),
    # and one holding only the CA's key entry (Java trusts a key entry's own certificate).
    for trust_store, password in ((jks["trust"], None), (jks["ca"], STORE_PASSWORD)):
        client = client_context(
            TlsConfig(
                key_store_location=str(jks["client"]),
                key_store_password=STORE_PASSWORD,
                trust_store_location=str(trust_store),
                trust_store_password=password,
            )
        )
        assert asyncio.run(_exchange(server_context(_jks_config(jks, "server")), client)) == b"ping"


def _one_line_error(make: Callable[[], object], *fragments: str) -> str:
    with pytest.raises(TlsConfigError) as raised:
        make()
    message = str(raised.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_jks_wrong_password_is_one_line(jks: dict[str, Path]) -> None:
    wrong_key_store = TlsConfig(
        key_store_location=str(jks["server"]), key_store_password="wrong", key_store_type="JKS"
    )
    _one_line_error(
        lambda: server_context(wrong_key_store),
        f"cannot open JKS key store {jks['server']}",
        "password is wrong",
        "check keyStore.password",
    )
    wrong_trust_store = TlsConfig(trust_store_location=str(jks["trust"]), trust_store_password="wrong")
    _one_line_error(
        lambda: client_context(wrong_trust_store),
        f"cannot open JKS trust store {jks['trust']}",
        "password is wrong",
        "check trustStore.password",
    )
    no_password = TlsConfig(key_store_location=str(jks["client"]))
    _one_line_error(lambda: client_context(no_password), str(jks["client"]), "set keyStore.password")
    other_key_password = TlsConfig(key_store_location=str(jks["keypass"]), key_store_password=STORE_PASSWORD)
    _one_line_error(
        lambda: server_context(other_key_password),
        str(jks["keypass"]),
        "its password is not keyStore.password",
    )
    only_certificates = TlsConfig(key_store_location=str(jks["trust"]), key_store_password=STORE_PASSWORD)
    _one_line_error(lambda: server_context(only_certificates), str(jks["trust"]), "has no private key entry")


def test_corrupt_jks_is_one_line(jks: dict[str, Path], tmp_path: Path) -> None:
    raw = jks["server"].read_bytes()
    truncated = tmp_path / "truncated.jks"
    truncated.write_bytes(raw[: len(raw) // 2])
    _one_line_error(
        lambda: server_context(
            TlsConfig(
                key_store_location=str(truncated), key_store_password=STORE_PASSWORD, key_store_type="JKS"
            )
        ),
        f"cannot open JKS key store {truncated}",
        "damaged",
        "point keyStore.location at the right file",
    )
    # One byte changed inside a certificate: it parses, but the store's integrity check fails.
    changed = tmp_path / "changed.jks"
    flipped = bytearray(raw)
    flipped[len(raw) - 100] ^= 0xFF
    changed.write_bytes(bytes(flipped))
    _one_line_error(
        lambda: server_context(TlsConfig(key_store_location=str(changed), key_store_password=STORE_PASSWORD)),
        f"cannot open JKS key store {changed}",
        "the file was changed",
    )
    garbage = tmp_path / "garbage.jks"
    garbage.write_bytes(b"\x00not a key store at all\n" * 10)
    _one_line_error(
        lambda: client_context(
            TlsConfig(
                trust_store_location=str(garbage), trust_store_password=STORE_PASSWORD, trust_store_type="JKS"
            )
        ),
        f"cannot open trust store {garbage}",
        "not a JKS, JCEKS, PKCS12 or PEM store",
        "point trustStore.location at the right file",
    )
    _one_line_error(
        lambda: client_context(
            TlsConfig(trust_store_location=str(tmp_path / "absent.jks"), trust_store_type="JKS")
        ),
        f"cannot read JKS trust store {tmp_path / 'absent.jks'}",
    )


def test_the_self_signed_pair_is_removed_when_the_process_exits(tmp_path: Path) -> None:
    code = (
        "from waltz_engine.net.tls import TlsConfig, server_context, _self_signed_pair; "
        "server_context(TlsConfig()); print(_self_signed_pair()[0])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    cert = Path(result.stdout.strip())
    assert cert.name == "cert.pem" and cert.parent.name.startswith("waltz-tls-"), result.stdout
    assert not cert.parent.exists()


def test_a_connection_names_the_certificate_its_peer_presented(pki: dict[str, Path]) -> None:
    """Over the node's own transport (serve/connect): with mutual TLS the server sees the
    client's certificate (DER), without a client certificate it sees none."""
    from waltz_engine.net.channel import FramedConnection, connect, serve
    from waltz_engine.wire.storage_messages import STORAGE_CODEC

    codecs = {0: STORAGE_CODEC}
    client_der = ssl.PEM_cert_to_DER_cert(pki["client"].read_text().split("-----BEGIN PRIVATE KEY-----")[0])

    async def peer_certificate(server_config: TlsConfig, client_config: TlsConfig) -> bytes | None:
        seen: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()

        async def handler(conn: FramedConnection) -> None:
            seen.set_result(conn.peer_certificate_der())

        server = await serve("127.0.0.1", 0, server_context(server_config), codecs, "s", handler, "test")
        try:
            port = server.sockets[0].getsockname()[1]
            conn = await connect("127.0.0.1", port, client_context(client_config), codecs, "c")
            try:
                return await asyncio.wait_for(seen, 5)
            finally:
                await conn.close()
        finally:
            server.close()
            await server.wait_closed()

    mutual = TlsConfig(key_store_location=str(pki["server"]), trust_store_location=str(pki["ca"]))
    client = TlsConfig(key_store_location=str(pki["client"]), trust_store_location=str(pki["ca"]))
    assert asyncio.run(peer_certificate(mutual, client)) == client_der
    assert asyncio.run(peer_certificate(TlsConfig(), TlsConfig())) is None
