"""Backups of a live cluster's committed log (our extension; the original has none): ``create``
(incremental, over the network), ``verify``, ``restore`` and the ``manifest`` that makes a run
visible all at once, on any store ``pyarrow.fs`` opens (``store``)."""

from waltz_engine.ops.backup.create import DEFAULT_SEGMENT_SIZE_BYTES, CreateSummary, create_backup
from waltz_engine.ops.backup.manifest import BackupError, describe_backup
from waltz_engine.ops.backup.restore import RestoreSummary, issued_sessions, restore_backup
from waltz_engine.ops.backup.store import KILL_AT_ENV, BackupStoreError
from waltz_engine.ops.backup.verify import BackupVerifyReport, verify_backup

__all__ = [
    "DEFAULT_SEGMENT_SIZE_BYTES",
    "KILL_AT_ENV",
    "BackupError",
    "BackupStoreError",
    "BackupVerifyReport",
    "CreateSummary",
    "RestoreSummary",
    "create_backup",
    "describe_backup",
    "issued_sessions",
    "restore_backup",
    "verify_backup",
]
