"""Listening ports for local clusters come from below the kernel's ephemeral range, where no
outgoing connection can take one between the pick and the node's bind."""

from __future__ import annotations

import re
import socket

import pytest
from testkit import REPO_ROOT, slice_port_range_for_worker

from waltz_engine.ops.devcluster import cluster, nodes


def test_a_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    floor = nodes._ephemeral_floor()
    if floor is None or floor - nodes.LISTEN_PORTS_FLOOR < nodes.ENOUGH_LISTEN_PORTS:
        pytest.skip("this kernel's ephemeral range leaves no room below it")
    for _ in range(20):
        port = nodes.free_port()
        assert nodes.LISTEN_PORTS_FLOOR <= port < floor
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((nodes.HOST, port))


def test_a_cluster_gets_distinct_ports_even_when_the_picks_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    picks = iter([20_001, 20_001, 20_002, 20_001, 20_003])
    monkeypatch.setattr(cluster, "free_port", lambda: next(picks))
    assert list(cluster._allocate_ports(None, 3)) == [20_001, 20_002, 20_003]


def test_without_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodes, "_ephemeral_floor", lambda: None)
    port = nodes.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((nodes.HOST, port))


def test_picks_that_keep_repeating_end_in_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "free_port", lambda: 20_001)
    with pytest.raises(nodes.DevClusterError, match="free ports of the 3 needed"):
        list(cluster._allocate_ports(None, 3))


def test_ports_come_from_the_port_range_and_never_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WALTZ_PORT_RANGE", "23000-23010")
    picked = [nodes.free_port() for _ in range(5)]
    assert all(23000 <= p < 23010 for p in picked)
    assert len(set(picked)) == len(picked)


@pytest.mark.parametrize("value", ["abc", "2000", "30000-20000", "0-10", "1-70000"])
def test_a_bad_port_range_is_one_line(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("WALTZ_PORT_RANGE", value)
    with pytest.raises(nodes.DevClusterError, match="expected LOW-HIGH"):
        nodes.free_port()


@pytest.mark.parametrize(
    ("given", "slices"),
    [
        ("20000-22000", ["20000-21000", "21000-22000"]),  # a range the run was given
        (None, ["10000-21000", "21000-32000"]),  # the suite's own range
    ],
)
def test_each_test_worker_picks_ports_from_its_own_slice(given: str | None, slices: list[str]) -> None:
    picked = []
    for worker in ("gw0", "gw1"):
        environ = {"PYTEST_XDIST_WORKER": worker, "PYTEST_XDIST_WORKER_COUNT": "2"}
        if given is not None:
            environ["WALTZ_PORT_RANGE"] = given
        slice_port_range_for_worker(environ)
        picked.append(environ["WALTZ_PORT_RANGE"])
    assert picked == slices


def test_a_process_a_worker_starts_keeps_the_workers_slice() -> None:
    # The child inherits the worker's environment, slice included, and imports the suite's
    # conftest again.
    environ = {
        "PYTEST_XDIST_WORKER": "gw1",
        "PYTEST_XDIST_WORKER_COUNT": "4",
        "WALTZ_PORT_RANGE": "10000-12000",
    }
    slice_port_range_for_worker(environ)
    assert environ["WALTZ_PORT_RANGE"] == "10500-11000"
    child = dict(environ)
    slice_port_range_for_worker(child)
    assert child["WALTZ_PORT_RANGE"] == "10500-11000"


def test_no_test_imports_the_conftest_a_second_time() -> None:
    # ``from tests.conftest import ...`` ran conftest.py again as another module, and its slicing
    # with it: the worker that imported it picked ports from a quarter of its slice.
    second_imports = [
        str(path.relative_to(REPO_ROOT))
        for path in (REPO_ROOT / "tests").rglob("*.py")
        if re.search(r"^\s*(from|import) tests\.conftest\b", path.read_text(encoding="utf-8"), re.MULTILINE)
    ]
    assert second_imports == []


def test_a_run_without_workers_keeps_its_range() -> None:
    environ = {"WALTZ_PORT_RANGE": "20000-22000"}
    slice_port_range_for_worker(environ)
    assert environ == {"WALTZ_PORT_RANGE": "20000-22000"}
