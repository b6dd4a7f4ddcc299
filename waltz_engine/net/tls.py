"""TLS contexts for every port, as the original: TLS always on (reference §0.1).

- No key store configured → a self-signed certificate made at start (one per process).
- A trust store configured on a server → client certificates are required.
- A client verifies the server only when it has a trust store; like the original (Netty's
  default), host names are not checked, since nodes advertise whatever name they resolve.

Stores are read as the original's ``ssl.keyStore.*`` / ``ssl.trustStore.*`` keys say:

- JKS (the original's default; JCEKS too): a key store's private key entry (its key must open
  with ``keyStore.password``, as Java's key manager needs) and certificate chain; a trust
  store's trusted certificate entries, and the certificate of any key entry (as Java trusts).
- PKCS12, as Java. Like Java (``keystore.type.compat``), a store typed JKS, JCEKS or PKCS12
  is read as whichever of them its content is.
- PEM, our extension: a file with the certificate chain and the private key; a trust store
  is a file of CA certificates.

With no ``type`` key the content decides (JKS/JCEKS magic, PEM blocks, DER PKCS12), so a Java
cluster's files and the PEM/PKCS12 files of earlier configs both work unchanged. A wrong
password or a damaged store is one line naming the file and what to check.
"""

from __future__ import annotations

import atexit
import datetime
import os
import shutil
import ssl
import tempfile
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from waltz_engine.common.errors import WaltzError

SELF_SIGNED_VALIDITY_DAYS = 3650
SUPPORTED_STORE_TYPES = ("JKS", "JCEKS", "PKCS12", "PEM")
_JKS_MAGIC = bytes.fromhex("feedfeed")
_JCEKS_MAGIC = bytes.fromhex("cececece")


class TlsConfigError(WaltzError):
    pass


@dataclass(frozen=True)
class TlsConfig:
    key_store_location: str | None = None
    key_store_password: str | None = None
    # None: no type key, the content decides (see the module's doc).
    key_store_type: str | None = None
    trust_store_location: str | None = None
    trust_store_password: str | None = None
    trust_store_type: str | None = None

    @classmethod
    def from_flat(cls, values: Mapping[str, Any], prefix: str) -> TlsConfig:
        """Read ``<prefix>.ssl.keyStore.location`` etc. from a flat, dot-keyed mapping."""

        def get(key: str) -> str | None:
            value = values.get(f"{prefix}.ssl.{key}")
            return None if value is None else str(value)

        def store_type(key: str) -> str | None:
            value = get(key)
            return value.strip().upper() if value and value.strip() else None

        return cls(
            key_store_location=get("keyStore.location"),
            key_store_password=get("keyStore.password"),
            key_store_type=store_type("keyStore.type"),
            trust_store_location=get("trustStore.location"),
            trust_store_password=get("trustStore.password"),
            trust_store_type=store_type("trustStore.type"),
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
            # Read only when a context loads it; gone when the process exits (one per process
            # start was left behind before).
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
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


def _store_format(kind: str, location: str, declared: str | None, raw: bytes) -> str:
    """How to read a store: JKS, JCEKS, PKCS12 or PEM, from its declared type and its content."""
    if declared is not None and declared not in SUPPORTED_STORE_TYPES:
        raise TlsConfigError(
            f"{kind} {location}: type {declared!r} is not supported "
            f"(use {', '.join(SUPPORTED_STORE_TYPES)}, or leave the type out to detect it)"
        )
    found: str | None = None
    if raw.startswith(_JKS_MAGIC):
        found = "JKS"
    elif raw.startswith(_JCEKS_MAGIC):
        found = "JCEKS"
    elif b"-----BEGIN " in raw:  # PEM blocks, maybe after text (openssl's "Bag Attributes")
        found = "PEM"
    elif raw.startswith(b"\x30"):  # a DER SEQUENCE: PKCS12's PFX
        found = "PKCS12"
    if declared == "PEM":
        return "PEM"
    if found is None:
        raise TlsConfigError(
            f"cannot open {kind} {location}: it is not a JKS, JCEKS, PKCS12 or PEM store "
            f"(damaged, or another kind of file); point {_config_key(kind, 'location')} at the right file"
        )
    if declared is not None and found == "PEM":
        raise TlsConfigError(
            f"{kind} {location} is a PEM file, not {declared}: set its type to PEM or leave the type out"
        )
    return found


def _what(kind: str, store_format: str) -> str:
    return f"{store_format} {kind}"


def _config_key(kind: str, field: str) -> str:
    """The config key (after its ``<prefix>.ssl.``) of a store's field: ``keyStore.password``."""
    return f"{'keyStore' if kind == 'key store' else 'trustStore'}.{field}"


def _load_java_store(kind: str, location: str, store_format: str, raw: bytes, password: str | None) -> Any:
    """A JKS/JCEKS store, its key entries opened with the store password when one is given."""
    import jks

    what = _what(kind, store_format)
    try:
        return jks.KeyStore.loads(raw, password, try_decrypt_keys=password is not None)
    except jks.KeystoreSignatureException:
        raise TlsConfigError(
            f"cannot open {what} {location}: the password is wrong or the file was changed "
            f"(integrity check failed); check {_config_key(kind, 'password')}"
        ) from None
    except Exception as e:  # pyjks parses untrusted bytes; any failure there is a damaged file
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        raise TlsConfigError(
            f"cannot open {what} {location}: the file is damaged or not a {store_format} store "
            f"({reason}); point {_config_key(kind, 'location')} at the right file"
        ) from None


def _load_chain_from_pem(ctx: ssl.SSLContext, key_pem: bytes, certs_pem: bytes) -> None:
    """``load_cert_chain`` needs a file: a private one, removed once loaded."""
    folder = Path(tempfile.mkdtemp(prefix="waltz-tls-"))
    try:
        pem = folder / "chain.pem"
        fd = os.open(pem, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem + certs_pem)
        ctx.load_cert_chain(str(pem))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _der_certs_to_pem(ders: list[bytes]) -> bytes:
    return b"".join(ssl.DER_cert_to_PEM_cert(der).encode("ascii") for der in ders)


def _load_jks_key_store(
    ctx: ssl.SSLContext, location: str, store_format: str, raw: bytes, password: str | None
) -> None:
    from cryptography.hazmat.primitives import serialization

    what = _what("key store", store_format)
    if not password:
        raise TlsConfigError(f"{what} {location} needs its password: set keyStore.password")
    store = _load_java_store("key store", location, store_format, raw, password)
    entries = list(store.private_keys.values())
    if not entries:
        raise TlsConfigError(
            f"{what} {location} has no private key entry (only trusted certificates?): "
            "a key store needs a key pair, e.g. from 'keytool -genkeypair'"
        )
    entry = entries[0]  # one key pair per store, as the original's deployments
    if not entry.is_decrypted():
        raise TlsConfigError(
            f"cannot open the private key {entry.alias!r} in {what} {location}: its password is not "
            "keyStore.password (Java's key manager needs them equal; change it with 'keytool -keypasswd')"
        )
    if not entry.cert_chain:
        raise TlsConfigError(f"{what} {location}: private key {entry.alias!r} has no certificate chain")
    try:
        key = serialization.load_der_private_key(entry.pkey_pkcs8, None)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        _load_chain_from_pem(ctx, key_pem, _der_certs_to_pem([der for _, der in entry.cert_chain]))
    except (ssl.SSLError, ValueError, TypeError) as e:
        raise TlsConfigError(
            f"cannot use the private key {entry.alias!r} in {what} {location}: {e}"
        ) from None


def _load_pkcs12_key_store(ctx: ssl.SSLContext, location: str, raw: bytes, password: str | None) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    try:
        key, cert, extra = pkcs12.load_key_and_certificates(raw, password.encode() if password else None)
    except ValueError as e:
        raise TlsConfigError(
            f"cannot open PKCS12 key store {location}: the password is wrong or the file is damaged ({e}); "
            "check keyStore.password and keyStore.type"
        ) from None
    if key is None or cert is None:
        raise TlsConfigError(f"PKCS12 key store {location} has no private key and certificate")
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    certs_pem = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in [cert, *(extra or [])])
    try:
        _load_chain_from_pem(ctx, key_pem, certs_pem)
    except ssl.SSLError as e:
        raise TlsConfigError(f"cannot load key store {location}: {e}") from None


def _read(kind: str, location: str, declared: str | None) -> bytes:
    try:
        return Path(location).read_bytes()
    except OSError as e:
        what = kind if declared is None else _what(kind, declared)
        raise TlsConfigError(f"cannot read {what} {location}: {e.strerror or e}") from None


def _load_key_store(ctx: ssl.SSLContext, config: TlsConfig) -> None:
    location = config.key_store_location
    if location is None:
        cert_file, key_file = _self_signed_pair()
        ctx.load_cert_chain(cert_file, key_file)
        return
    raw = _read("key store", location, config.key_store_type)
    store_format = _store_format("key store", location, config.key_store_type, raw)
    password = config.key_store_password
    if store_format in ("JKS", "JCEKS"):
        _load_jks_key_store(ctx, location, store_format, raw, password)
    elif store_format == "PKCS12":
        _load_pkcs12_key_store(ctx, location, raw, password)
    else:
        try:
            ctx.load_cert_chain(location, password=password)
        except (ssl.SSLError, ValueError) as e:
            raise TlsConfigError(
                f"cannot load PEM key store {location}: {e}; it needs the certificate chain and the "
                "private key (check keyStore.password if the key is encrypted)"
            ) from None


def _trusted_certs_pem(location: str, store_format: str, raw: bytes, password: str | None) -> str:
    """The trust store's certificates as PEM text."""
    if store_format == "PEM":
        try:
            return raw.decode("ascii")
        except UnicodeDecodeError:
            raise TlsConfigError(f"PEM trust store {location} is not PEM text") from None
    if store_format in ("JKS", "JCEKS"):
        store = _load_java_store("trust store", location, store_format, raw, password)
        ders = [entry.cert for entry in store.certs.values()]
        # Java trusts a key entry's own certificate too (KeyStores' trusted certificates).
        ders += [entry.cert_chain[0][1] for entry in store.private_keys.values() if entry.cert_chain]
        return _der_certs_to_pem(ders).decode("ascii")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    try:
        loaded = pkcs12.load_pkcs12(raw, password.encode() if password else None)
    except ValueError as e:
        raise TlsConfigError(
            f"cannot open PKCS12 trust store {location}: the password is wrong or the file is damaged "
            f"({e}); check trustStore.password and trustStore.type"
        ) from None
    certs = [c.certificate for c in loaded.additional_certs]
    if loaded.cert is not None:
        certs.append(loaded.cert.certificate)
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)


def _load_trust_store(ctx: ssl.SSLContext, config: TlsConfig) -> bool:
    location = config.trust_store_location
    if location is None:
        return False
    raw = _read("trust store", location, config.trust_store_type)
    store_format = _store_format("trust store", location, config.trust_store_type, raw)
    cadata = _trusted_certs_pem(location, store_format, raw, config.trust_store_password)
    if "-----BEGIN CERTIFICATE-----" not in cadata:
        raise TlsConfigError(
            f"{store_format} trust store {location} holds no certificate: import the CA with "
            "'keytool -importcert' (or list the CA certificates in the PEM file)"
        )
    try:
        ctx.load_verify_locations(cadata=cadata)
    except (ssl.SSLError, ValueError) as e:
        raise TlsConfigError(f"cannot load {store_format} trust store {location}: {e}") from None
    return True


def server_context(config: TlsConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_key_store(ctx, config)
    ctx.verify_mode = ssl.CERT_REQUIRED if _load_trust_store(ctx, config) else ssl.CERT_NONE
    return ctx


# Client contexts that present a certificate (see presents_certificate).
_with_certificate: weakref.WeakSet[ssl.SSLContext] = weakref.WeakSet()


def presents_certificate(ctx: ssl.SSLContext | None) -> bool:
    """Whether a :func:`client_context` presents a certificate (a server can name its client):
    only then does a client offer our codec version 5, which carries ACL refusals (issue 34)."""
    return ctx is not None and ctx in _with_certificate


def client_context(config: TlsConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    if config.key_store_location is not None:
        _load_key_store(ctx, config)
        _with_certificate.add(ctx)
    ctx.verify_mode = ssl.CERT_REQUIRED if _load_trust_store(ctx, config) else ssl.CERT_NONE
    return ctx
