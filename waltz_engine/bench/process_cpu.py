"""CPU seconds (user + system) of processes, read from ``/proc/<pid>/stat`` (Linux).

The benchmarks take a snapshot before and after the measured interval and report the
difference per 1 000 transactions for every node process, which shows where a
transaction's CPU goes better than wall-clock throughput on a shared machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# Fields of /proc/<pid>/stat after the ")" closing the command name: state is field 3 of
# proc(5), so utime (14) and stime (15) are at offsets 11 and 12 of what follows ")".
_UTIME_OFFSET = 11
_STIME_OFFSET = 12
_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` used so far (its threads included), None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[_UTIME_OFFSET]) + int(fields[_STIME_OFFSET])) / _CLOCK_TICKS_PER_S


def snapshot(pids: Mapping[str, int]) -> dict[str, float | None]:
    """CPU seconds of each named process now."""
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def used_since(before: Mapping[str, float | None], pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds each named process used since ``before`` (processes gone or new are left out)."""
    used: dict[str, float] = {}
    for name, pid in pids.items():
        start, end = before.get(name), cpu_seconds(pid)
        if start is not None and end is not None:
            used[name] = end - start
    return used
