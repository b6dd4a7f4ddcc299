"""Principal names from DER certificates (RFC 4514 subject DNs, mapping rules, SANs) and the
principal forms an ACL accepts (issue 34)."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from waltz_engine.auth.principal import (
    PrincipalError,
    normalize_principal,
    parse_rules,
    principal_from_der,
)

KEY = ec.generate_private_key(ec.SECP256R1())


def der(
    attributes: list[tuple[x509.ObjectIdentifier, str]], sans: list[x509.GeneralName] | None = None
) -> bytes:
    """A self-signed certificate whose subject has ``attributes`` in DER order (C..CN)."""
    name = x509.Name([x509.NameAttribute(oid, value) for oid, value in attributes])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(KEY.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(KEY, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


CN, O, OU, C = (  # noqa: E741
    NameOID.COMMON_NAME,
    NameOID.ORGANIZATION_NAME,
    NameOID.ORGANIZATIONAL_UNIT_NAME,
    NameOID.COUNTRY_NAME,
)


def test_the_subject_dn_in_rfc_4514_order_with_o_and_ou() -> None:
    # Java's X500Principal.getName() (and Kafka) write the last RDN first: CN first here.
    cert = der([(C, "US"), (O, "payments"), (OU, "ledger"), (CN, "svc-a")])
    assert principal_from_der(cert) == "CN=svc-a,OU=ledger,O=payments,C=US"


@pytest.mark.parametrize(
    ("common_name", "written"),
    [
        ("svc, a", "CN=svc\\, a"),
        ("a+b", "CN=a\\+b"),
        ('say "hi"', 'CN=say \\"hi\\"'),
        ("back\\slash", "CN=back\\\\slash"),
        ("<svc>;", "CN=\\<svc\\>\\;"),
        ("#leading", "CN=\\#leading"),
        (" padded ", "CN=\\ padded\\ "),
        ("é-ü", "CN=é-ü"),
    ],
)
def test_special_characters_are_escaped_as_rfc_4514_says(common_name: str, written: str) -> None:
    principal = principal_from_der(der([(O, "x"), (CN, common_name)]))
    assert principal == f"{written},O=x"
    # An ACL names it the same way, and the name survives normalization unchanged.
    assert normalize_principal(principal) == principal


def test_kafka_style_rules_map_the_dn_first_match_wins() -> None:
    cert = der([(O, "payments"), (OU, "ServiceUsers"), (CN, "Svc-A")])
    rules = parse_rules("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, RULE:^CN=(.*?),.*$/$1/, DEFAULT")
    assert principal_from_der(cert, rules) == "User:svc-a"
    other = der([(O, "payments"), (CN, "Batch")])
    assert principal_from_der(other, rules) == "User:Batch"
    upper = parse_rules(["RULE:^CN=([^,]*),.*$/$1/U"])
    assert principal_from_der(other, upper) == "User:BATCH"


def test_no_applicable_rule_gives_no_principal() -> None:
    rules = parse_rules("RULE:^CN=(.*),OU=ServiceUsers$/$1/")
    assert principal_from_der(der([(O, "payments"), (CN, "svc-a")]), rules) is None


def test_san_rules_name_the_principal_by_a_subject_alternative_name() -> None:
    cert = der(
        [(O, "payments"), (CN, "ignored")],
        [
            x509.DNSName("svc-a.payments.internal"),
            x509.UniformResourceIdentifier("spiffe://cluster.local/ns/payments/sa/svc-a"),
            x509.RFC822Name("svc-a@example.com"),
            x509.IPAddress(ipaddress.ip_address("10.1.2.3")),
        ],
    )
    assert principal_from_der(
        cert, parse_rules(r"SAN:URI:^spiffe:\/\/cluster.local\/ns\/(.*)\/sa\/(.*)$/$1.$2/")
    ) == ("User:payments.svc-a")
    assert principal_from_der(cert, parse_rules("SAN:DNS:^(.*)\\.payments\\.internal$/$1/")) == "User:svc-a"
    assert principal_from_der(cert, parse_rules("SAN:EMAIL:^(.*)@example.com$/$1/U")) == "User:SVC-A"
    assert principal_from_der(cert, parse_rules("SAN:IP:^(10\\..*)$/$1/")) == "User:10.1.2.3"
    # No SAN of that type matches: the next rule, here DEFAULT, decides.
    assert principal_from_der(cert, parse_rules("SAN:DNS:^nope$/x/, DEFAULT")) == "CN=ignored,O=payments"
    assert principal_from_der(der([(CN, "no-sans")]), parse_rules("SAN:DNS:^(.*)$/$1/")) is None


@pytest.mark.parametrize(
    "rule", ["RULE:no-slashes", "SAN:FAX:^(.*)$/$1/", "RULE:^(unclosed$/$1/", "RULE:a/b/X", "default"]
)
def test_a_bad_rule_is_one_clear_error(rule: str) -> None:
    with pytest.raises(PrincipalError, match="rule"):
        parse_rules(rule)


def test_principal_forms_an_acl_accepts() -> None:
    assert normalize_principal("CN=svc-a, O=payments") == "CN=svc-a,O=payments"
    assert normalize_principal("*") == "*"
    assert normalize_principal("User:svc-a") == "User:svc-a"
    for bad in ("svc-a", "Group:ops", "User:", "CN=a,,O=b"):
        with pytest.raises(PrincipalError, match="principal"):
            normalize_principal(bad)
