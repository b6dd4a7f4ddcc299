"""A node process profiled by cProfile, for measurements (issue 33): off unless asked.

``WALTZ_PROFILE_DIR=DIR`` makes every node process whose kind is listed in
``WALTZ_PROFILE_NODES`` (comma-separated, ``server`` when unset; ``storage,server`` for both)
run under :mod:`cProfile` and write ``DIR/<kind>-<pid>.pstats`` when it stops cleanly (SIGTERM,
as `waltz bench` and the local cluster stop their nodes). Every thread of the process is
profiled (``threading.setprofile``), each into its own profile, all written to the one file.
The call counts are exact; the times carry the profiler's own cost (a node runs 2-3x slower
under it), so they tell where the time goes, not how much there is.

Read it with ``python -m pstats DIR/server-PID.pstats`` (``sort tottime``, ``stats 40``).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

PROFILE_DIR_ENV = "WALTZ_PROFILE_DIR"
PROFILE_NODES_ENV = "WALTZ_PROFILE_NODES"
DEFAULT_PROFILED_NODES = "server"

T = TypeVar("T")


def profile_path(kind: str) -> Path | None:
    """Where a node process of ``kind`` writes its profile; None: it is not profiled."""
    directory = os.environ.get(PROFILE_DIR_ENV)
    if not directory:
        return None
    kinds = {name.strip() for name in os.environ.get(PROFILE_NODES_ENV, DEFAULT_PROFILED_NODES).split(",")}
    if kind not in kinds:
        return None
    return Path(directory) / f"{kind}-{os.getpid()}.pstats"


def run_profiled(kind: str, run: Callable[[], T]) -> T:
    """``run()``, under cProfile when :func:`profile_path` names a file for ``kind``."""
    path = profile_path(kind)
    if path is None:
        return run()
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    def start_thread(frame: Any, event: str, arg: Any) -> None:
        # The first call in a new thread: that thread gets a profiler of its own from here on.
        profile = cProfile.Profile()
        with lock:
            profiles.append(profile)
        profile.enable()  # (replaces this hook in this thread only)

    main = cProfile.Profile()
    profiles.append(main)
    threading.setprofile(start_thread)
    main.enable()
    try:
        return run()
    finally:
        main.disable()
        threading.setprofile(None)
        with lock:
            done = [profile for profile in profiles if profile.getstats()]
        if done:
            path.parent.mkdir(parents=True, exist_ok=True)
            pstats.Stats(*done).dump_stats(path)
