"""TLS contexts for every port, as the original: TLS always on (reference §0.1).

- No key store configured → a self-signed certificate made at start (one per process).
- A trust store configured on a server → client certificates are required.
- A client verifies the server only when it has a trust store; like the original (Netty's
  default), host names are not checked, since nodes advertise whatever name they resolve.

Stores are PEM (a file with the certificate chain and the private key; a trust store is a
file of CA certificates) or PKCS12. Java's JKS cannot be read here: convert it with
``keytool -importkeystore -deststoretype PKCS12``.
"""

from __future__ import annotations

import datetime
import ssl
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from waltz_engine.errors import WaltzError

SELF_SIGNED_VALIDITY_DAYS = 3650
SUPPORTED_STORE_TYPES = ("PEM", "PKCS12")


class TlsConfigError(WaltzError):
    pass


@dataclass(frozen=True)
class TlsConfig:
    key_store_location: str | None = None
    key_store_password: str | None = None
    key_store_type: str = "PEM"
    trust_store_location: str | None = None
    trust_store_password: str | None = None
    trust_store_type: str = "PEM"

    @classmethod
    def from_flat(cls, values: Mapping[str, Any], prefix: str) -> TlsConfig:
        """Read ``<prefix>.ssl.keyStore.location`` etc. from a flat, dot-keyed mapping."""

        def get(key: str) -> str | None:
            value = values.get(f"{prefix}.ssl.{key}")
            return None if value is None else str(value)

        return cls(
            key_store_location=get("keyStore.location"),
            key_store_password=get("keyStore.password"),
            key_store_type=(get("keyStore.type") or "PEM").upper(),
            trust_store_location=get("trustStore.location"),
            trust_store_password=get("trustStore.password"),
            trust_store_type=(get("trustStore.type") or "PEM").upper(),
        )


_self_signed_lock = threading.Lock()
_self_signed_files: tuple[str, str] | None = None


def _self_signed_pair() -> tuple[str, str]:
    """Paths of a certificate and key made once per process (the original's insecure context)."""
    global _self_signed_files
    with _self_signed_lock:
        if _self_signed_files is None:
            from cryptography import x509
            from cryptography.hazmat.primitives import hashes, serialization
            from cryptography.hazmat.primitives.asymmetric import ec
            from cryptography.x509.oid import NameOID

            key = ec.generate_private_key(ec.SECP256R1())
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "waltz-self-signed")])
            now = datetime.datetime.now(datetime.UTC)
            cert = (
                x509.CertificateBuilder()
                .subject_name(name)
                .issuer_name(name)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_VALIDITY_DAYS))
                .sign(key, hashes.SHA256())
            )
            folder = Path(tempfile.mkdtemp(prefix="waltz-tls-"))
            cert_path, key_path = folder / "cert.pem", folder / "key.pem"
            cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
            key_path.write_bytes(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
            key_path.chmod(0o600)
            _self_signed_files = (str(cert_path), str(key_path))
        return _self_signed_files


def _check_type(kind: str, store_type: str) -> None:
    if store_type == "JKS":
        raise TlsConfigError(
            f"{kind} type JKS cannot be read by Python: convert it to PKCS12 with "
            "'keytool -importkeystore -deststoretype PKCS12' and set the type to PKCS12"
        )
    if store_type not in SUPPORTED_STORE_TYPES:
        raise TlsConfigError(f"{kind} type {store_type!r} is not supported (use PEM or PKCS12)")


def _read(kind: str, location: str) -> bytes:
    try:
        return Path(location).read_bytes()
    except OSError as e:
        raise TlsConfigError(f"cannot read {kind} {location}: {e.strerror or e}") from e


def _load_key_store(ctx: ssl.SSLContext, config: TlsConfig) -> None:
    location = config.key_store_location
    if location is None:
        cert_file, key_file = _self_signed_pair()
        ctx.load_cert_chain(cert_file, key_file)
        return
    _check_type("key store", config.key_store_type)
    password = config.key_store_password
    try:
        if config.key_store_type == "PEM":
            _read("key store", location)
            ctx.load_cert_chain(location, password=password)
            return
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.serialization import pkcs12

        key, cert, extra = pkcs12.load_key_and_certificates(
            _read("key store", location), password.encode() if password else None
        )
        if key is None or cert is None:
            raise TlsConfigError(f"key store {location} has no private key and certificate")
        folder = Path(tempfile.mkdtemp(prefix="waltz-tls-"))
        pem = folder / "chain.pem"
        pem.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            + b"".join(c.public_bytes(serialization.Encoding.PEM) for c in [cert, *(extra or [])])
        )
        pem.chmod(0o600)
        ctx.load_cert_chain(str(pem))
    except (ssl.SSLError, ValueError) as e:
        raise TlsConfigError(f"cannot load key store {location}: {e}") from e


def _load_trust_store(ctx: ssl.SSLContext, config: TlsConfig) -> bool:
    location = config.trust_store_location
    if location is None:
        return False
    _check_type("trust store", config.trust_store_type)
    raw = _read("trust store", location)
    try:
        if config.trust_store_type == "PEM":
            ctx.load_verify_locations(cadata=raw.decode("ascii"))
        else:
            from cryptography.hazmat.primitives import serialization
            from cryptography.hazmat.primitives.serialization import pkcs12

            password = config.trust_store_password
            loaded = pkcs12.load_pkcs12(raw, password.encode() if password else None)
            certs = [c.certificate for c in loaded.additional_certs]
            if loaded.cert is not None:
                certs.append(loaded.cert.certificate)
            if not certs:
                raise TlsConfigError(f"trust store {location} holds no certificate")
            ctx.load_verify_locations(
                cadata="".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)
            )
    except (ssl.SSLError, ValueError, UnicodeDecodeError) as e:
        raise TlsConfigError(f"cannot load trust store {location}: {e}") from e
    return True


def server_context(config: TlsConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_key_store(ctx, config)
    ctx.verify_mode = ssl.CERT_REQUIRED if _load_trust_store(ctx, config) else ssl.CERT_NONE
    return ctx


def client_context(config: TlsConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    if config.key_store_location is not None:
        _load_key_store(ctx, config)
    ctx.verify_mode = ssl.CERT_REQUIRED if _load_trust_store(ctx, config) else ssl.CERT_NONE
    return ctx
