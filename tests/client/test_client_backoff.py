"""The reconnect backoff (exponential, jittered, capped) and how a TLS refusal is recognised."""

from __future__ import annotations

import ssl

import pytest

from waltz_engine.client.driver import describe_certificate_refusal
from waltz_engine.common.backoff import Backoff
from waltz_engine.net.channel import ConnectionClosedError


def test_backoff_doubles_to_its_cap_and_starts_over_on_reset() -> None:
    backoff = Backoff(100, 1_000, 2.0, 0.25, rand=lambda: 0.5)  # no jitter drawn
    assert [backoff.next_delay_ms() for _ in range(6)] == [100, 200, 400, 800, 1_000, 1_000]
    assert backoff.attempts == 6
    backoff.reset()
    assert backoff.next_delay_ms() == 100


@pytest.mark.parametrize(("draw", "expected"), [(0.0, 75.0), (1.0, 125.0)])
def test_backoff_jitter_stays_within_its_band(draw: float, expected: float) -> None:
    assert Backoff(100, 1_000, 2.0, 0.25, rand=lambda: draw).next_delay_ms() == expected


def test_backoff_jitter_never_exceeds_the_cap() -> None:
    backoff = Backoff(100, 100, 2.0, 0.25, rand=lambda: 1.0)
    assert backoff.next_delay_ms() == 100


def _alert(reason: str) -> ConnectionClosedError:
    error = ssl.SSLError(1, f"[SSL: {reason}] alert")
    error.reason = reason  # what OpenSSL sets for an alert from the peer (a Java server sends one)
    closed = ConnectionClosedError("cannot connect")
    closed.__cause__ = error
    return closed


def test_alerts_name_the_certificate() -> None:
    wanted = describe_certificate_refusal("s:1", _alert("TLSV13_ALERT_CERTIFICATE_REQUIRED"), False, True)
    assert wanted is not None and "asked for this client's certificate" in wanted
    refused = describe_certificate_refusal("s:1", _alert("SSLV3_ALERT_BAD_CERTIFICATE"), True, False)
    assert refused is not None and "refused this client's certificate" in refused
    assert describe_certificate_refusal("s:1", _alert("WRONG_VERSION_NUMBER"), True, True) is None


def test_a_hang_up_counts_only_once_tls_was_spoken() -> None:
    assert describe_certificate_refusal("s:1", ConnectionRefusedError(), False, False) is None
    reset = describe_certificate_refusal("s:1", ConnectionResetError(), True, False)
    assert reset is not None and "refused this client's certificate" in reset
    eof = describe_certificate_refusal("s:1", ConnectionClosedError("peer closed"), False, True)
    assert eof is not None and "asked for" in eof
    assert describe_certificate_refusal("s:1", ConnectionClosedError("peer closed"), False, False) is None
