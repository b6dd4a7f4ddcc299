"""Where a backup run begins a partition once retention has removed its head (issue 31): a first
backup begins at the retained start; a backup that retention overtook stops with the gap named."""

from __future__ import annotations

import pytest

from waltz_engine.ops.backup import BackupError
from waltz_engine.ops.backup.create import _first_to_copy
from waltz_engine.ops.backup.manifest import PartitionEntry

NOTHING = PartitionEntry(0, -1, ())
HELD = PartitionEntry(0, 99, ("0/0000000000000000000.seg",))


def test_a_first_backup_begins_at_the_retained_start() -> None:
    assert _first_to_copy(0, NOTHING, 170, 400) == 170
    assert _first_to_copy(0, NOTHING, 0, 400) == 0


def test_a_backup_ahead_of_retention_goes_on_where_it_ended() -> None:
    assert _first_to_copy(0, HELD, 100, 400) == 100
    assert _first_to_copy(0, HELD, 50, 400) == 100
    assert _first_to_copy(0, HELD, 170, 99) == 100  # nothing new committed: nothing to copy


def test_a_backup_that_retention_overtook_names_the_gap() -> None:
    with pytest.raises(BackupError, match=r"partition 3: .* up to 99, .* removed 100\.\.169 .*--to NEW_URL"):
        _first_to_copy(3, HELD, 170, 400)
