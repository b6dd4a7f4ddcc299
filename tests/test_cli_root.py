"""The `waltz` command itself: every group listed, a version, a clean error for unknown input."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from waltz_cli.main import app
from waltz_engine import __version__

runner = CliRunner()
STARTUP_TIMEOUT_S = 60.0
GROUPS = (
    "tail",
    "append",
    "create-cluster",
    "recover",
    "truncate",
    "inspect",
    "zk",
    "storage",
    "server",
    "cluster",
    "client",
    "dev",
    "bench",
    "retention",
    "spark",
    "top",
    "smoke",
)
SUBGROUPS = ("zk", "storage", "server", "cluster", "retention")


def test_help_lists_every_group() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for group in GROUPS:
        assert group in result.output


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output and "0.13.2" in result.output


def test_unknown_command_is_a_usage_error_without_traceback() -> None:
    result = runner.invoke(app, ["no-such-command"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_groups_show_help_bare_and_with_h() -> None:
    for group in SUBGROUPS:
        bare = runner.invoke(app, [group])
        short = runner.invoke(app, [group, "-h"])
        assert short.exit_code == 0, short.output
        assert "Usage: waltz " + group in " ".join(short.output.split())
        assert bare.exit_code in (0, 2) and "Usage:" in bare.output, bare.output
        assert "Traceback" not in bare.output + short.output


# A SIGINT while the `waltz` script starts: as the package's import ends and the command's modules
# are still loading (the first half second), and while the command's own group module (`waltz
# storage ...` imports the storage group's) is imported after the package (issue 31).
INTERRUPTED_STARTS = {
    "package": (
        "import os, signal, sys; sys.argv[0] = 'waltz'; import waltz_cli; "
        "os.kill(os.getpid(), signal.SIGINT); import waltz_cli.main; print('not interrupted')"
    ),
    "command module": (
        "import os, signal, sys; sys.argv[:] = ['waltz', 'storage', 'list', '--help']; import waltz_cli; "
        "import waltz_cli.main as m; real = m._commands\n"
        "def interrupted(module):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(module)\n"
        "m._commands = interrupted; m.main(); print('not interrupted')"
    ),
}


@pytest.mark.parametrize("when", sorted(INTERRUPTED_STARTS))
def test_ctrl_c_while_the_command_starts_is_one_line_and_exit_130(when: str) -> None:
    """No traceback: one line and exit 130."""
    result = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_STARTS[when]],
        capture_output=True,
        text=True,
        timeout=STARTUP_TIMEOUT_S,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (130, "", "error: interrupted\n")
