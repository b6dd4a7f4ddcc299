"""ACL entries and decisions (deny wins, ranges, everyone), their znode document, and the audit
log's aggregation of floods (issue 34)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from waltz_engine.auth.acl import (
    ADMIN,
    APPEND,
    NO_PARTITION,
    READ,
    AclError,
    Acls,
    make_entries,
    parse_operations,
    parse_partitions,
)
from waltz_engine.auth.audit import AuditLog

A, B = "CN=svc-a,O=payments", "CN=svc-b,O=payments"


def test_allow_on_ranges_and_deny_wins() -> None:
    acls = Acls(
        [
            *make_entries(A, ["append,read"], "0-3", deny=False),
            *make_entries("*", ["read"], "7", deny=False),
            *make_entries(A, ["append"], "2", deny=True),
        ]
    )
    assert acls.decide(A, APPEND, 0).allowed and acls.decide(A, READ, 3).allowed
    assert not acls.decide(A, APPEND, 2).allowed  # deny wins over the range's allow
    assert acls.decide(A, READ, 2).allowed  # ... for its operation only
    assert not acls.decide(A, APPEND, 4).allowed  # no entry: no
    assert acls.decide(B, READ, 7).allowed and not acls.decide(B, READ, 0).allowed  # * is everyone
    assert not acls.decide(A, ADMIN, 0).allowed


def test_requests_about_no_partition_need_an_entry_on_every_partition() -> None:
    ranged = Acls(make_entries(A, ["admin"], "0-1000", deny=False))
    assert not ranged.decide(A, ADMIN, NO_PARTITION).allowed
    everything = Acls(make_entries(A, ["admin"], "*", deny=False))
    assert everything.decide(A, ADMIN, NO_PARTITION).allowed and everything.decide(A, ADMIN, 5).allowed


def test_the_znode_document_round_trips_and_bad_ones_are_refused() -> None:
    acls = Acls(
        [*make_entries(A, ["read"], "3,0-2", deny=False), *make_entries(B, ["admin"], "all", deny=True)]
    )
    assert Acls.from_bytes(acls.to_bytes()) == acls
    assert [e.partitions for e in acls.entries] == ["0-3", "*"]
    assert Acls.from_bytes(None) == Acls()
    for bad in (b"{", b'{"version": 2, "entries": []}', b'{"version": 1, "entries": [{"principal": "x"}]}'):
        with pytest.raises(AclError):
            Acls.from_bytes(bad)
    wrong_op = {"version": 1, "entries": [{"principal": A, "operation": "write", "partitions": "*"}]}
    with pytest.raises(AclError, match="bad entry"):
        Acls.from_bytes(json.dumps(wrong_op).encode())


def test_options_are_checked_with_one_line_errors() -> None:
    assert parse_operations("append, READ,append") == [APPEND, READ]
    with pytest.raises(AclError, match="unknown operation 'write'"):
        parse_operations("append,write")
    assert parse_partitions("*") == "*" and parse_partitions("5,1-3") == "1-3,5"
    with pytest.raises(AclError, match="3-1"):
        parse_partitions("3-1")
    with pytest.raises(AclError, match="unknown principal form"):
        make_entries("svc-a", ["read"], "0", deny=False)


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_a_flood_of_refusals_is_aggregated_with_its_count_never_dropped(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "audit.log"
    audit = AuditLog(path, "server 1", aggregate_ms=60_000, monotonic_s=clock)
    for _ in range(1_000):
        audit.refused(A, APPEND, "partition 2", "AppendRequest", "127.0.0.1:1")
    audit.refused(B, READ, "partition 0", "MountRequest", "127.0.0.1:2")
    clock.now_s += 61  # the window ended: the next refusal first writes the aggregate
    audit.refused(A, APPEND, "partition 2", "AppendRequest", "127.0.0.1:1")
    audit.acl_changed([{"principal": A}], [], 3)
    audit.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    refusals = [
        (r["principal"], r["count"], r.get("aggregated", False)) for r in lines if r["event"] == "refused"
    ]
    assert refusals == [(A, 1, False), (B, 1, False), (A, 999, True), (A, 1, False)]
    assert sum(count for principal, count, _ in refusals if principal == A) == 1_001
    assert lines[-1]["event"] == "acl-change" and lines[-1]["znode_version"] == 3
    assert all(r["node"] == "server 1" and r.get("decision", "deny") == "deny" for r in lines)
