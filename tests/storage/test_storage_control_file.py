"""The control file: torn struct writes, low-water mark rules, (un)assignment, the lock."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from waltz_engine.common.errors import FormatError, StorageError
from waltz_engine.disk.partition_info import (
    FLAG_ASSIGNED,
    FLAG_AVAILABLE,
    STRUCT1_OFFSET,
    STRUCT2_OFFSET,
    STRUCT_SIZE_BYTES,
    PartitionInfoStruct,
    decode_record,
    partition_info_offset,
)
from waltz_engine.storage import ConcurrentUpdateError, ControlFile, SessionInfo, StorageManager
from waltz_engine.storage.constants import CONTROL_FILE_NAME

KEY = uuid.UUID("9a4d0e55-3c1b-4b7e-8f0a-2d6c4e1b7a90")
ASSIGNED_AND_AVAILABLE = FLAG_ASSIGNED | FLAG_AVAILABLE


def _control(directory: Path, num_partitions: int = 2) -> ControlFile:
    return ControlFile.open(directory / CONTROL_FILE_NAME, KEY, num_partitions)


def _structs_on_disk(directory: Path, partition_id: int) -> tuple[PartitionInfoStruct, PartitionInfoStruct]:
    decoded = decode_record((directory / CONTROL_FILE_NAME).read_bytes(), partition_info_offset(partition_id))
    return decoded.struct1.value, decoded.struct2.value


def test_a_struct_torn_at_any_byte_falls_back_to_the_other(tmp_path: Path) -> None:
    with _control(tmp_path) as control:
        info = control.partition_info(1)
        info.set_flag(FLAG_ASSIGNED, True)  # struct 1, seq 1
        info.set_low_water_mark(0, 10, 10)  # struct 2, seq 2: current
        old = info.current
    pristine = (tmp_path / CONTROL_FILE_NAME).read_bytes()
    # The next update would write struct 1 with seq 3.
    new = PartitionInfoStruct(1, 20, 20, ASSIGNED_AND_AVAILABLE, 3)
    position = partition_info_offset(1) + STRUCT1_OFFSET
    for torn_at in range(STRUCT_SIZE_BYTES + 1):
        torn = bytearray(pristine)
        torn[position : position + torn_at] = new.to_bytes()[:torn_at]
        (tmp_path / CONTROL_FILE_NAME).write_bytes(torn)
        with _control(tmp_path) as control:
            info = control.partition_info(1)
            assert info.current == (new if torn_at == STRUCT_SIZE_BYTES else old), torn_at
            assert control.partition_info(0).current.sequence_number == 0
            # Writing goes on from the surviving struct: the torn one is overwritten, seq + 1.
            info.set_low_water_mark(2, 30, 30)
        with _control(tmp_path) as control:
            assert control.partition_info(1).current.sequence_number == info.current.sequence_number
            assert control.partition_info(1).last_session_info() == SessionInfo(2, 30, 30)


def test_low_water_mark_rules(tmp_path: Path) -> None:
    with _control(tmp_path) as control:
        info = control.partition_info(0)
        info.set_low_water_mark(3, 100, 90)
        with pytest.raises(ConcurrentUpdateError, match="session id has changed to 3"):
            info.set_low_water_mark(2, 200, 190)
        with pytest.raises(StorageError, match="less than current low watermark 100"):
            info.set_low_water_mark(4, 99, 95)
        with pytest.raises(StorageError, match="less than current local low watermark 90"):
            info.set_low_water_mark(4, 100, 89)
        info.set_low_water_mark(3, 100, 90)  # the same session may repeat itself
        assert info.current.sequence_number == 2
    with _control(tmp_path) as control:
        assert control.partition_info(0).last_session_info() == SessionInfo(3, 100, 90)


def test_unassign_resets_the_structs_as_the_original(tmp_path: Path) -> None:
    fresh = PartitionInfoStruct(-1, -1, -1, FLAG_AVAILABLE, -1)
    assigned = fresh._replace(flags=ASSIGNED_AND_AVAILABLE, sequence_number=1)
    with StorageManager(tmp_path, KEY, 2) as manager:
        manager.set_partition_assignment([0, 1], True)
        manager.partition(0).set_low_water_mark(0, -1)  # struct 2 current, seq 2
        assert manager.assigned_partition_status() == {0: True, 1: True}
        manager.set_partition_available([1], False)
        assert manager.assigned_partition_status() == {0: True, 1: False}
        manager.set_partition_assignment([0], False, delete_storage_files=True)
        with pytest.raises(StorageError, match="Partition:0 is not assigned"):
            manager.partition(0)
        assert not list((tmp_path / "0").iterdir())
        # The current struct (2) gets seq -1 and the other 0 ...
        assert _structs_on_disk(tmp_path, 0) == (fresh._replace(sequence_number=0), fresh)
        # ... and, in the same run, the next update still goes to the other one (struct 1).
        manager.set_partition_assignment([0], True)
        assert _structs_on_disk(tmp_path, 0) == (assigned, fresh)
        manager.set_partition_assignment([0], False)  # struct 1 was current: now -1, struct 2 0
        assert (tmp_path / "0" / "0000000000000000000.seg").exists()
    with StorageManager(tmp_path, KEY, 2) as manager:
        assert manager.assigned_partition_ids() == [1]
        manager.set_partition_assignment([0], True)  # a reader takes seq 0 (struct 2) as current
        assert _structs_on_disk(tmp_path, 0) == (assigned, fresh._replace(sequence_number=0))
        assert manager.partition(0).max_transaction_id() == -1


def test_truncated_control_file_is_refused(tmp_path: Path) -> None:
    _control(tmp_path).close()
    path = tmp_path / CONTROL_FILE_NAME
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(FormatError, match="control file is truncated"):
        _control(tmp_path)


def test_both_structs_with_the_same_sequence_number_are_refused(tmp_path: Path) -> None:
    _control(tmp_path).close()
    path = tmp_path / CONTROL_FILE_NAME
    data = bytearray(path.read_bytes())
    same = PartitionInfoStruct(-1, -1, -1, FLAG_AVAILABLE, 0).to_bytes()
    base = partition_info_offset(0)
    data[base + STRUCT1_OFFSET : base + STRUCT1_OFFSET + STRUCT_SIZE_BYTES] = same
    data[base + STRUCT2_OFFSET : base + STRUCT2_OFFSET + STRUCT_SIZE_BYTES] = same
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="sequence number"):
        _control(tmp_path)


_HOLDER = textwrap.dedent(
    """
    import sys, uuid
    from pathlib import Path
    from waltz_engine.storage import StorageManager
    from waltz_engine.common.errors import StorageError
    try:
        manager = StorageManager(Path(sys.argv[1]), uuid.UUID(sys.argv[2]), 2)
    except StorageError as e:
        print("refused:", e, flush=True)
        sys.exit(3)
    print("locked", flush=True)
    sys.stdin.readline()
    manager.close()
    """
)


def _try_from_another_process(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _HOLDER, str(directory), str(KEY)], input="", capture_output=True, text=True
    )


def test_a_second_opener_is_refused(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path), str(KEY)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline() == "locked\n"
        expected = rf"storage directory {tmp_path} is in use by another process \(pid {holder.pid}\)"
        with pytest.raises(StorageError, match=expected):
            StorageManager(tmp_path, KEY, 2)
    finally:
        holder.stdin.close()
        assert holder.wait() == 0
    with StorageManager(tmp_path, KEY, 2):
        # In the same process as well; and the refused attempt must not drop our lock
        # (closing any descriptor of a file drops a process's POSIX locks on it).
        with pytest.raises(StorageError, match="is in use by another process"):
            StorageManager(tmp_path, KEY, 2)
        refused = _try_from_another_process(tmp_path)
        assert refused.returncode == 3 and "is in use by another process" in refused.stdout
    assert _try_from_another_process(tmp_path).returncode == 0
