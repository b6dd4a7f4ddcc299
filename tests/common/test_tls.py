"""TLS contexts over real loopback sockets: self-signed default, required client certs, PKCS12."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from waltz_engine.tls import TlsConfig, TlsConfigError, client_context, server_context


def _cert(name: str, issuer_key: ec.EllipticCurvePrivateKey | None, issuer: x509.Name | None, ca: bool):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer or subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(issuer_key or key, hashes.SHA256())
    )
    return key, cert


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    ca_key, ca = _cert("test-ca", None, None, True)
    out: dict[str, Path] = {"ca": d / "ca.pem"}
    out["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for who in ("server", "client"):
        key, cert = _cert(who, ca_key, ca.subject, False)
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
    with pytest.raises(TlsConfigError, match="JKS cannot be read"):
        server_context(TlsConfig(key_store_location=str(pki["server"]), key_store_type="JKS"))
    with pytest.raises(TlsConfigError, match="cannot read key store"):
        server_context(TlsConfig(key_store_location=str(tmp_path / "missing.pem")))
    with pytest.raises(TlsConfigError, match="wrong password|cannot load key store"):
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
