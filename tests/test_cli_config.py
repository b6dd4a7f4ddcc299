"""Where a command finds the cluster, and what it says about its config (real ZooKeeper, real processes).

Flags win over the environment, the environment over the config file, and with nothing given
the local dev cluster's `.waltz-dev/client.yml` is used; a misspelled key is warned about.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from cluster_support import waltz_cli_command
from storage_node_support import create_test_cluster
from zygote import run_forked

CLI_TIMEOUT_S = 60.0


def waltz(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WALTZ_")}
    return run_forked(
        waltz_cli_command(*args), args, cwd=cwd, env={**clean, **(env or {})}, timeout_s=CLI_TIMEOUT_S
    )


def write_yaml(path: Path, values: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


def test_a_misspelled_config_key_is_warned_about_once(zookeeper: str, tmp_path: Path) -> None:
    root, key = create_test_cluster(zookeeper, 2)
    config = write_yaml(
        tmp_path / "tools.yml",
        {
            "zookeeper.connectString": zookeeper,
            "cluster.root": root,
            "zookeeper.sesionTimeout": 5000,
            # The client's TLS keys are read by `append` and `tail`: never "unknown".
            "client.ssl.keyStore.location": str(tmp_path / "client.jks"),
        },
    )
    result = waltz("zk", "show-cluster-key", "-c", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert str(key) in result.stdout
    warnings = [line for line in result.stderr.splitlines() if "zookeeper.sesionTimeout" in line]
    assert len(warnings) == 1, result.stderr
    assert warnings[0].startswith("warning: ") and "unknown config key" in warnings[0]
    assert warnings[0].endswith("did you mean 'zookeeper.sessionTimeout'?)")
    assert "client.ssl" not in result.stderr


def test_the_dev_cluster_config_is_the_fallback_and_flags_and_env_win(zookeeper: str, tmp_path: Path) -> None:
    dev_root, dev_key = create_test_cluster(zookeeper, 1)
    other_root, other_key = create_test_cluster(zookeeper, 1)
    write_yaml(
        tmp_path / ".waltz-dev" / "client.yml",
        {"zookeeper.connectString": zookeeper, "cluster.root": dev_root},
    )

    bare = waltz("zk", "show-cluster-key", cwd=tmp_path)
    assert bare.returncode == 0, bare.stderr
    assert str(dev_key) in bare.stdout

    by_env = waltz("zk", "show-cluster-key", cwd=tmp_path, env={"WALTZ_CLUSTER_ROOT": other_root})
    assert by_env.returncode == 0, by_env.stderr
    assert str(other_key) in by_env.stdout

    by_flag = waltz(
        "zk", "show-cluster-key", "-r", other_root, cwd=tmp_path, env={"WALTZ_CLUSTER_ROOT": dev_root}
    )
    assert by_flag.returncode == 0, by_flag.stderr
    assert str(other_key) in by_flag.stdout


def test_no_cluster_anywhere_is_one_line_that_says_what_to_do(tmp_path: Path) -> None:
    result = waltz("zk", "list", cwd=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "-z" in lines[0] and "waltz dev up" in lines[0] and "WALTZ_CONFIG" in lines[0]


def test_short_help_and_completion_install(tmp_path: Path) -> None:
    short = waltz("zk", "list", "-h", cwd=tmp_path)
    assert short.returncode == 0 and "Usage: " in short.stdout and "Example: waltz zk list" in short.stdout
    # `--show-completion` is a flag: typer finds the shell among the command's ancestors, so it
    # runs from bash here, as a user's would (a test runner's ancestry may hold no shell at all).
    shown = subprocess.run(
        ["bash", "-c", '"$0" -m waltz_cli --show-completion; exit $?', sys.executable],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "complete" in shown.stdout and "waltz" in shown.stdout
