"""Each of the smoke test's seven checks passes on clean records and detects a planted violation."""

from __future__ import annotations

import uuid

from waltz_engine.smoke.checks import (
    Applied,
    check_checksum,
    check_consecutive,
    check_no_double_apply,
    check_no_double_commit,
    check_not_committed_absent,
    check_replicas,
    check_reread,
)
from waltz_engine.smoke.report import SmokeReport

NUM_PARTITIONS = 3
NUM_TXNS = 30
SEED = 7


def _data(n: int) -> list[str]:
    return [uuid.UUID(int=(i + 1) * 0x1234_5678_9ABC_DEF1_2345).hex for i in range(n)]


def _log(data: list[str]) -> list[Applied]:
    next_id = {p: 0 for p in range(NUM_PARTITIONS)}
    records = []
    for i, d in enumerate(data):
        partition_id = i % NUM_PARTITIONS
        records.append(Applied(partition_id, next_id[partition_id], d))
        next_id[partition_id] += 1
    return records


def _clean() -> tuple[dict[str, list[str]], dict[str, list[Applied]]]:
    data = _data(NUM_TXNS)
    committed = {"client-0": data[::2], "client-1": data[1::2]}
    return committed, {"client-0": _log(data), "client-1": _log(data)}


def _marks(records: list[Applied]) -> dict[int, int]:
    return {p: max(r.transaction_id for r in records if r.partition_id == p) for p in range(NUM_PARTITIONS)}


def test_clean_records_pass_every_check() -> None:
    committed, applied = _clean()
    reread = applied["client-0"]
    assert check_no_double_commit(committed).ok
    assert check_consecutive(applied).ok
    assert check_no_double_apply(applied).ok
    assert check_checksum(committed, applied).ok
    assert check_reread(committed, reread, _marks(reread)).ok
    assert check_replicas({"storage-0": {0: 7, 1: 8}, "storage-1": {0: 7, 1: 8}}).ok
    assert check_not_committed_absent({"client-0": [uuid.uuid4().hex]}, applied).ok


def test_a_double_commit_is_detected() -> None:
    committed, _ = _clean()
    committed["client-1"].append(committed["client-0"][0])
    assert not check_no_double_commit(committed).ok


def test_a_skipped_transaction_id_is_detected() -> None:
    _, applied = _clean()
    del applied["client-1"][4]
    result = check_consecutive(applied)
    assert not result.ok and "expected=" in result.detail


def test_a_repeated_transaction_id_is_detected() -> None:
    _, applied = _clean()
    applied["client-0"].insert(5, applied["client-0"][4])
    assert not check_consecutive(applied).ok


def test_a_double_application_is_detected() -> None:
    _, applied = _clean()
    first = applied["client-0"][0]
    applied["client-0"].append(Applied(first.partition_id, NUM_TXNS, first.data))
    assert not check_no_double_apply(applied).ok


def test_a_lost_transaction_breaks_the_checksum() -> None:
    committed, applied = _clean()
    applied["client-1"].pop()
    assert not check_checksum(committed, applied).ok


def test_altered_data_breaks_the_checksum() -> None:
    committed, applied = _clean()
    r = applied["client-0"][3]
    applied["client-0"][3] = Applied(r.partition_id, r.transaction_id, uuid.uuid4().hex)
    assert not check_checksum(committed, applied).ok


def test_a_reread_short_of_the_high_water_mark_is_detected() -> None:
    committed, applied = _clean()
    reread = applied["client-0"]
    marks = _marks(reread)
    assert not check_reread(committed, reread[:-1], marks).ok


def test_a_reread_with_different_data_is_detected() -> None:
    committed, applied = _clean()
    reread = list(applied["client-0"])
    r = reread[0]
    reread[0] = Applied(r.partition_id, r.transaction_id, uuid.uuid4().hex)
    assert not check_reread(committed, reread, _marks(reread)).ok


def test_a_wrong_reread_names_the_transactions_that_differ_from_what_a_client_applied() -> None:
    committed, applied = _clean()
    reread = list(applied["client-0"])
    r = reread[4]
    wrong = uuid.uuid4().hex
    reread[4] = Applied(r.partition_id, r.transaction_id, wrong)
    result = check_reread(committed, reread, _marks(reread), applied=applied["client-1"])
    assert not result.ok
    assert f"read {len(reread)} transactions, a client applied {len(reread)}" in result.detail
    assert f"1 differ from what it applied, e.g. partition {r.partition_id} " in result.detail
    assert f"transaction {r.transaction_id}: read {wrong}, applied {r.data}" in result.detail


def test_differing_replicas_are_detected() -> None:
    result = check_replicas({"storage-0": {0: 7, 1: 8}, "storage-1": {0: 7, 1: 9}, "storage-2": {0: 7, 1: 8}})
    assert not result.ok and "partition[1]" in result.detail


def test_a_replica_missing_a_partition_is_detected() -> None:
    assert not check_replicas({"storage-0": {0: 7, 1: 8}, "storage-1": {0: 7}}).ok


def test_a_transaction_told_not_committed_in_the_log_is_detected() -> None:
    """The smoke run of seed 20261122: both clients told "failed", the transactions in the log."""
    committed, applied = _clean()
    in_log = committed["client-1"].pop()
    result = check_not_committed_absent({"client-0": [], "client-1": [in_log]}, applied)
    assert not result.ok and in_log in result.detail


def test_unknown_outcomes_may_be_in_the_log_or_not() -> None:
    committed, applied = _clean()
    maybe = committed["client-1"].pop()  # in the log, but the client was told "unknown"
    assert not check_checksum(committed, applied).ok
    assert check_checksum(committed, applied, {maybe}).ok
    reread = applied["client-0"]
    assert check_reread(committed, reread, _marks(reread), {maybe}).ok
    absent = uuid.uuid4().hex  # told "unknown", and not in the log: as right
    assert check_checksum(committed, applied, {maybe, absent}).ok


def test_a_report_passes_with_every_check_including_the_outcome_contract() -> None:
    """The report counts the contract's check: a run whose seven checks pass passes (it once
    said FAILED with every check OK, expecting six)."""
    committed, applied = _clean()
    reread = applied["client-0"]
    results = [
        check_no_double_commit(committed),
        check_consecutive(applied),
        check_no_double_apply(applied),
        check_checksum(committed, applied),
        check_not_committed_absent({}, applied),
        check_reread(committed, reread, _marks(reread)),
        check_replicas({"storage-0": {0: 7}, "storage-1": {0: 7}}),
    ]
    report = SmokeReport(SEED, "smoke", [], checks=results)
    assert report.passed
    assert not SmokeReport(SEED, "smoke", [], checks=results[:-1]).passed
