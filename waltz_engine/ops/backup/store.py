"""Where a backup lives: an :class:`~waltz_engine.common.object_store.ObjectStore` whose writes
a test hook can stop at any step."""

from __future__ import annotations

import os
import signal

from waltz_engine.common.object_store import TMP_DIR, ObjectStore, ObjectStoreError, sha256_of_file

# Test hook: the process kills itself (SIGKILL) just before its N-th file operation that
# changes the backup (1-based), so that tests can stop a run at every step cheaply.
KILL_AT_ENV = "WALTZ_BACKUP_KILL_AT_FILE_OP"

BackupStoreError = ObjectStoreError

__all__ = ["KILL_AT_ENV", "TMP_DIR", "BackupStore", "BackupStoreError", "sha256_of_file"]


class BackupStore(ObjectStore):
    """One backup's root; every ``name`` is a '/'-separated path relative to it."""

    def __init__(self, url: str) -> None:
        super().__init__(url, "waltz backup")
        self._operations = 0
        kill_at = os.environ.get(KILL_AT_ENV)
        self._kill_at = int(kill_at) if kill_at else None

    def _step(self) -> None:
        """Count a changing operation; the test hook kills the process at the chosen one."""
        self._operations += 1
        if self._kill_at is not None and self._operations >= self._kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
