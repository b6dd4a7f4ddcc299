"""Backups of a live cluster's committed log (our extension; the original has none): ``create``
(incremental, over the network), ``verify``, ``restore`` and the ``manifest`` that makes a run
visible all at once, on any store ``pyarrow.fs`` opens (``store``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from waltz_engine.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from waltz_engine.ops.backup.create import DEFAULT_SEGMENT_SIZE_BYTES, CreateSummary, create_backup
    from waltz_engine.ops.backup.manifest import BackupError, describe_backup
    from waltz_engine.ops.backup.restore import RestoreSummary, issued_sessions, restore_backup
    from waltz_engine.ops.backup.store import KILL_AT_ENV, BackupStoreError
    from waltz_engine.ops.backup.verify import BackupVerifyReport, verify_backup

_EXPORTS = {
    "DEFAULT_SEGMENT_SIZE_BYTES": "create",
    "CreateSummary": "create",
    "create_backup": "create",
    "BackupError": "manifest",
    "describe_backup": "manifest",
    "RestoreSummary": "restore",
    "issued_sessions": "restore",
    "restore_backup": "restore",
    "KILL_AT_ENV": "store",
    "BackupStoreError": "store",
    "BackupVerifyReport": "verify",
    "verify_backup": "verify",
}

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

__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
