"""The smoke test's correctness checks (reference §5.2's six and the client's outcome contract),
as pure functions over what the client processes recorded, so each can be tested against a
planted violation.

Data: every transaction carries a random UUID (16 bytes). A client records the UUIDs of its
contexts that completed (``committed``), of those told "not committed" (``on_completion(False)``)
and of those whose outcome is unknown (``OutcomeUnknownError``: in the log or not, either is
right), and every transaction it applied as ``(partition, transaction id, UUID)`` (``applied``);
every client applies every partition.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

NO_TRANSACTION = -1
CHECKSUM_MODULUS = 1 << 64
HASH_BYTES = 8
MAX_EXAMPLES = 3  # violations quoted in a check's detail line


class Applied(NamedTuple):
    partition_id: int
    transaction_id: int
    data: str  # the UUID as 32 hex digits


class CheckResult(NamedTuple):
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{self.name}: {'OK' if self.ok else 'ERR'} ({self.detail})"

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


def data_hash(data: str) -> int:
    """The additive checksum's term for one UUID (the original sums ``uuid.hashCode()``)."""
    return int(data[: 2 * HASH_BYTES], 16)


def additive_checksum(data: Iterable[str]) -> int:
    """Order-independent: a lost, duplicated or altered transaction changes it."""
    return sum(data_hash(d) for d in data) % CHECKSUM_MODULUS


def _examples(items: Iterable[object]) -> str:
    return ", ".join(str(i) for i in list(items)[:MAX_EXAMPLES])


def check_no_double_commit(committed: Mapping[str, Sequence[str]]) -> CheckResult:
    """(1) No context completed twice: every committed UUID, over all clients, is unique."""
    counts = Counter(d for uuids in committed.values() for d in uuids)
    twice = [d for d, n in counts.items() if n > 1]
    total = sum(counts.values())
    if twice:
        return CheckResult("committed-once", False, f"{len(twice)} committed twice, e.g. {_examples(twice)}")
    return CheckResult("committed-once", True, f"{total} committed")


def check_consecutive(applied: Mapping[str, Sequence[Applied]]) -> CheckResult:
    """(2) Every client was fed each partition's transactions as 0, 1, 2, ... (none skipped
    or repeated; the original's ``unexpected transaction: expected=.. actual=..``)."""
    errors: list[str] = []
    for client, records in applied.items():
        last: dict[int, int] = {}
        for record in records:
            expected = last.get(record.partition_id, NO_TRANSACTION) + 1
            if record.transaction_id != expected:
                errors.append(
                    f"{client} partition {record.partition_id}: "
                    f"expected={expected} actual={record.transaction_id}"
                )
            last[record.partition_id] = record.transaction_id
    if errors:
        return CheckResult("consecutive-ids", False, f"{len(errors)} gaps, e.g. {_examples(errors)}")
    return CheckResult("consecutive-ids", True, f"{sum(len(r) for r in applied.values())} callbacks")


def check_no_double_apply(applied: Mapping[str, Sequence[Applied]]) -> CheckResult:
    """(3) No client applied the same data twice (a transaction appended twice, or fed twice
    under two ids)."""
    errors: list[str] = []
    for client, records in applied.items():
        counts = Counter(r.data for r in records)
        errors += [f"{client}: {d} x{n}" for d, n in counts.items() if n > 1]
    if errors:
        return CheckResult("applied-once", False, f"{len(errors)} applied twice, e.g. {_examples(errors)}")
    return CheckResult("applied-once", True, f"{len(applied)} clients")


def _decided(records: Iterable[Applied], unknown: Collection[str]) -> list[str]:
    """The applied data whose outcome the producer was told (unknown ones may be there or not)."""
    return [r.data for r in records if r.data not in unknown]


def check_checksum(
    committed: Mapping[str, Sequence[str]],
    applied: Mapping[str, Sequence[Applied]],
    unknown: Collection[str] = frozenset(),
) -> CheckResult:
    """(4) Each client's applied data, but for outcomes left unknown, sums to what all clients
    produced (committed)."""
    produced = additive_checksum(d for uuids in committed.values() for d in uuids)
    sums = {client: additive_checksum(_decided(records, unknown)) for client, records in applied.items()}
    wrong = [f"{client}: {found:#x} != {produced:#x}" for client, found in sums.items() if found != produced]
    if wrong:
        return CheckResult("checksum", False, "; ".join(wrong))
    return CheckResult("checksum", True, f"{produced:#x}")


def check_reread(
    committed: Mapping[str, Sequence[str]],
    reread: Sequence[Applied],
    high_water_marks: Mapping[int, int],
    unknown: Collection[str] = frozenset(),
    applied: Sequence[Applied] = (),
) -> CheckResult:
    """(5) A fresh client reading every partition from the start, after every node restarted,
    gets 0..high-water mark of each, and exactly the committed data. ``applied``: what a client
    applied (checks 2-4 vouch for it), to name the transactions a wrong re-read differs at."""
    consecutive = check_consecutive({"re-read": reread})
    if not consecutive.ok:
        return CheckResult("re-read", False, consecutive.detail)
    last: dict[int, int] = {}
    for record in reread:
        last[record.partition_id] = record.transaction_id
    short = [
        f"partition {p}: read up to {last.get(p, NO_TRANSACTION)}, high-water mark {mark}"
        for p, mark in sorted(high_water_marks.items())
        if last.get(p, NO_TRANSACTION) != mark
    ]
    if short:
        return CheckResult("re-read", False, "; ".join(short))
    produced = additive_checksum(d for uuids in committed.values() for d in uuids)
    found = additive_checksum(_decided(reread, unknown))
    if found != produced:
        where = _differences(reread, applied)
        return CheckResult("re-read", False, f"checksum {found:#x} != produced {produced:#x}{where}")
    return CheckResult(
        "re-read", True, f"numConsumed={len(reread)} hwmarks={dict(sorted(high_water_marks.items()))}"
    )


def _differences(reread: Sequence[Applied], applied: Sequence[Applied]) -> str:
    """Where the re-read's data differs from a client's applied data, as a detail's tail."""
    expected = {(r.partition_id, r.transaction_id): r.data for r in applied}
    differ = [
        f"partition {r.partition_id} transaction {r.transaction_id}: read {r.data}, applied {wanted}"
        for r in reread
        if (wanted := expected.get((r.partition_id, r.transaction_id))) is not None and wanted != r.data
    ]
    tail = f"; read {len(reread)} transactions, a client applied {len(applied)}"
    if differ:
        tail += f"; {len(differ)} differ from what it applied, e.g. {_examples(differ)}"
    return tail


def check_not_committed_absent(
    not_committed: Mapping[str, Sequence[str]], applied: Mapping[str, Sequence[Applied]]
) -> CheckResult:
    """(7) The outcome contract: no transaction a client was told is not committed
    (``on_completion(False)``) is in the log, as any client applied it."""
    told = {d for uuids in not_committed.values() for d in uuids}
    found = sorted({r.data for records in applied.values() for r in records if r.data in told})
    if found:
        return CheckResult(
            "not-committed-absent",
            False,
            f"{len(found)} told not committed are in the log, e.g. {_examples(found)}",
        )
    return CheckResult("not-committed-absent", True, f"{len(told)} told not committed, none in the log")


def check_replicas(checksums: Mapping[str, Mapping[int, int]]) -> CheckResult:
    """(6) Every storage node holds byte-identical segments (CRC-32 per partition)."""
    partitions = sorted({p for per_node in checksums.values() for p in per_node})
    differ = [
        f"partition[{p}] {dict((node, per_node.get(p)) for node, per_node in sorted(checksums.items()))}"
        for p in partitions
        if len({per_node.get(p) for per_node in checksums.values()}) != 1
    ]
    if differ:
        return CheckResult("replicas", False, "; ".join(differ))
    return CheckResult("replicas", True, f"{len(partitions)} partitions x {len(checksums)} replicas equal")
