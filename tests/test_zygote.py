"""The suite's zygote (tests/zygote.py) hands back processes that behave as started cold: exit
statuses, stdio, working directory, environment, signals, and the title `ps` shows."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from zygote import launch_forked_node, run_forked, start_forked

WAIT_S = 60.0


def test_a_command_reports_its_exit_status_and_output(tmp_path: Path) -> None:
    result = run_forked(["waltz", "--version"], ["--version"], cwd=tmp_path, timeout_s=WAIT_S)
    assert result.returncode == 0 and result.stdout.strip(), result
    result = run_forked(["waltz", "--bogus"], ["--bogus"], timeout_s=WAIT_S)
    assert result.returncode == 2 and "--bogus" in result.stderr, result


def test_a_node_module_logs_to_its_file_and_exits_with_its_status(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    node = launch_forked_node(
        "waltz_engine.storage", ["--config", str(tmp_path / "absent.yml")], tmp_path, log
    )
    assert node.wait(WAIT_S) == 1
    assert node.poll() == 1
    assert log.read_text().startswith("error: "), log.read_text()


def test_a_killed_child_reports_the_signal_and_wait_times_out_before(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    child = start_forked(
        "http.server",
        ["0", "--bind", "127.0.0.1"],
        stdio=[("/dev/null", "r"), (str(log), "a"), (None, "a")],
        cwd=tmp_path,
    )
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)
    assert child.poll() is None
    title = Path(f"/proc/{child.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    assert title == "python -m http.server 0 --bind 127.0.0.1", title
    child.kill()
    assert child.wait(WAIT_S) == -signal.SIGKILL
