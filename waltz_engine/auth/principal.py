"""Who is on the other end of a connection: a principal from its verified TLS certificate.

The principal is the certificate's subject DN as RFC 4514 writes it (``CN=svc-a,O=payments``,
built from the DER bytes with ``cryptography``; the same string Java's ``X500Principal.getName()``
and so Kafka's authorizer give), unless mapping rules (``authorizer.principal.mapping.rules``,
Kafka's ``ssl.principal.mapping.rules`` syntax plus SAN rules) say otherwise:

- ``DEFAULT``: the subject DN as it is;
- ``RULE:pattern/replacement/[LU]``: when ``pattern`` matches the whole DN, the DN rewritten
  (``$1`` is the first group; ``L``/``U`` lower or upper case the result), as ``User:NAME``;
- ``SAN:TYPE:pattern/replacement/[LU]`` (ours), TYPE one of DNS, URI, EMAIL, IP: the first
  subject alternative name of that type that the pattern matches, rewritten, as ``User:NAME``.

A ``/`` inside a pattern or replacement is written ``\\/`` (as Kafka's rules).

Rules are tried in order and the first that applies wins; when none does the connection has no
principal and is refused (as Kafka's ``NoMatchingRule``). A principal is ``*`` (everyone, in an
ACL only), a DN, or ``User:NAME``; :func:`normalize_principal` checks and normalizes the form.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from waltz_engine.common.errors import WaltzError

ANY_PRINCIPAL = "*"
USER_PREFIX = "User:"
DEFAULT_RULE = "DEFAULT"
SAN_TYPES = ("DNS", "URI", "EMAIL", "IP")
# A rule list in one string: rules split where the next one starts (a pattern may hold commas).
_RULE_SPLIT = re.compile(r"\s*,\s*(?=RULE:|SAN:|DEFAULT\b)")
_RULE = re.compile(
    r"(?:SAN:(?P<san>[A-Z]+):|RULE:)(?P<pattern>(?:\\.|[^/\\])*)/(?P<replacement>(?:\\.|[^/\\])*)/(?P<flags>[LU]?)$"
)
_JAVA_GROUP = re.compile(r"\$(\d+)")
_UNESCAPED_COMMA = re.compile(r"(?<!\\),")


class PrincipalError(WaltzError):
    """A principal, or a mapping rule, is not of a form we know."""


@dataclass(frozen=True)
class MappingRule:
    """One rule: ``san`` None for a rule on the DN (DEFAULT has no pattern)."""

    text: str
    pattern: re.Pattern[str] | None = None
    replacement: str = ""
    case: str = ""
    san: str | None = None

    @property
    def is_default(self) -> bool:
        return self.pattern is None

    def apply(self, value: str) -> str | None:
        assert self.pattern is not None
        if self.pattern.fullmatch(value) is None:
            return None
        result = self.pattern.sub(self.replacement, value, count=1)
        if self.case == "L":
            result = result.lower()
        elif self.case == "U":
            result = result.upper()
        return result


DEFAULT_RULES: tuple[MappingRule, ...] = (MappingRule(DEFAULT_RULE),)


def parse_rules(rules: str | Sequence[str] | None) -> tuple[MappingRule, ...]:
    """Rules from a config value: a list, or one string of comma-separated rules; none is DEFAULT."""
    if rules is None:
        return DEFAULT_RULES
    texts = _RULE_SPLIT.split(rules.strip()) if isinstance(rules, str) else [str(r).strip() for r in rules]
    parsed = [_parse_rule(text) for text in texts if text]
    return tuple(parsed) if parsed else DEFAULT_RULES


def _parse_rule(text: str) -> MappingRule:
    if text == DEFAULT_RULE:
        return MappingRule(text)
    found = _RULE.fullmatch(text)
    if found is None:
        raise PrincipalError(
            f"principal mapping rule {text!r} is not DEFAULT, RULE:pattern/replacement/[LU] "
            f"or SAN:TYPE:pattern/replacement/[LU] (TYPE one of {', '.join(SAN_TYPES)})"
        )
    san = found.group("san")
    if san is not None and san not in SAN_TYPES:
        raise PrincipalError(
            f"principal mapping rule {text!r}: SAN type {san} is not one of {', '.join(SAN_TYPES)}"
        )
    try:
        pattern = re.compile(found.group("pattern").replace("\\/", "/"))
    except re.error as e:
        raise PrincipalError(f"principal mapping rule {text!r}: bad pattern: {e}") from None
    # Java's replacement syntax ($1) in Python's (\g<1>).
    replacement = _JAVA_GROUP.sub(r"\\g<\1>", found.group("replacement").replace("\\/", "/"))
    return MappingRule(text, pattern, replacement, found.group("flags"), san)


def _san_values(cert: object, san_type: str) -> list[str]:
    from cryptography import x509

    assert isinstance(cert, x509.Certificate)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    kind: Any = {
        "DNS": x509.DNSName,
        "URI": x509.UniformResourceIdentifier,
        "EMAIL": x509.RFC822Name,
        "IP": x509.IPAddress,
    }[san_type]
    return [str(value) for value in names.get_values_for_type(kind)]


def principal_from_der(der: bytes, rules: Iterable[MappingRule] = DEFAULT_RULES) -> str | None:
    """The principal of a DER certificate by ``rules``; None when no rule applies."""
    from cryptography import x509

    cert = x509.load_der_x509_certificate(der)
    dn = cert.subject.rfc4514_string()
    for rule in rules:
        if rule.is_default:
            return dn
        if rule.san is None:
            mapped = rule.apply(dn)
            if mapped is not None:
                return USER_PREFIX + mapped
            continue
        for value in _san_values(cert, rule.san):
            mapped = rule.apply(value)
            if mapped is not None:
                return USER_PREFIX + mapped
    return None


def _strip_unescaped(part: str) -> str:
    """``part`` without the spaces around it, an escaped trailing space (``\\ ``) kept."""
    part = part.lstrip()
    while part.endswith(" ") and not part.endswith("\\ "):
        part = part[:-1]
    return part


def normalize_principal(text: str) -> str:
    """``*``, ``User:NAME`` or a DN in its RFC 4514 form (spacing and escapes as a certificate's
    would be written); anything else is a :class:`PrincipalError` saying what to give."""
    from cryptography import x509

    value = text.strip()
    if value == ANY_PRINCIPAL:
        return value
    if value.startswith(USER_PREFIX):
        if not value[len(USER_PREFIX) :].strip():
            raise PrincipalError(f"principal {text!r}: User: needs a name after it")
        return value
    hint = (
        "give a certificate's subject DN (CN=svc-a,O=payments), User:NAME (a name a mapping rule "
        "makes), or * for everyone"
    )
    if "=" not in value:
        raise PrincipalError(f"unknown principal form {text!r}: {hint}")
    # Spaces after the separating commas, as people write DNs, are not part of RFC 4514.
    value = ",".join(_strip_unescaped(part) for part in _UNESCAPED_COMMA.split(value))
    try:
        name = x509.Name.from_rfc4514_string(value)
    except ValueError as e:
        raise PrincipalError(f"principal {text!r} is not an RFC 4514 DN ({e}): {hint}") from None
    return name.rfc4514_string()
