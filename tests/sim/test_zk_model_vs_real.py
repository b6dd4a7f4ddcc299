"""The simulator's ZooKeeper model against the real thing: the same scripts, the same logs.

Each script runs once on the session's real ZooKeeper (every client behind its own TCP proxy, so
one can be cut off) and once on :class:`SimZooKeeper`; results, errors, versions, child versions,
sequence numbers, ephemeral owners, watch events and connection states must match step by step.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from zk_compare_support import Side, comparable, model_side, real_side

Script = Callable[[Side, str], None]


def crud_and_versions(s: Side, root: str) -> None:
    s.open("a")
    n, deep = f"{root}/n", f"{root}/missing/child"
    for call in (
        lambda c: c.create(root, b""),
        lambda c: c.create(n, b"v0"),
        lambda c: c.get(n),
        lambda c: c.set(n, b"v1", version=0),
        lambda c: c.set(n, b"v2", version=0),  # lost CAS
        lambda c: c.set(n, b"v2"),
        lambda c: c.get(n),
        lambda c: c.create(n, b"again"),
        lambda c: c.create(deep, b"m"),
        lambda c: c.create(deep, b"m", makepath=True),
        lambda c: c.get(f"{root}/missing"),
        lambda c: c.delete(f"{root}/missing"),  # has a child
        lambda c: c.delete(n, version=7),
        lambda c: c.delete(n, version=2),
        lambda c: c.get(n),
        lambda c: c.set(n, b"x"),
        lambda c: c.delete(n),
        lambda c: c.exists(n),
        lambda c: c.get_children(n),
        lambda c: c.create(f"{root}/null", None),  # Java's create(path, null)
        lambda c: c.get(f"{root}/null"),
        lambda c: c.set(f"{root}/null", None, version=0),
        lambda c: c.get(f"{root}/null"),
        lambda c: c.create(f"{root}/empty", b""),
        lambda c: c.get(f"{root}/empty"),
        lambda c: c.ensure_path(f"{root}/e1/e2/e3"),
        lambda c: c.get(f"{root}/e1/e2"),
        lambda c: c.get_children(root),
        lambda c: c.get_children(root, include_data=True),
        lambda c: c.exists(root),
        lambda c: c.get_async(f"{root}/empty").get(timeout=5),
        lambda c: c.sync(root),
        lambda c: c.delete(root, recursive=True),
        lambda c: c.exists(root),
        lambda c: c.delete(root, recursive=True),  # already gone: kazoo ignores it
    ):
        s.run("a", call)


def sequential_and_ephemeral(s: Side, root: str) -> None:
    s.open("a")
    s.open("b")
    prefix = f"{root}/s_"
    s.run("a", lambda c: c.create(root, None))
    s.run("a", lambda c: c.create(prefix, b"1", sequence=True))
    s.run("a", lambda c: c.create(prefix, b"2", sequence=True))
    s.run("a", lambda c: c.delete(f"{prefix}0000000001"))
    s.run("a", lambda c: c.create(f"{root}/plain", b""))
    s.run("a", lambda c: c.create(prefix, b"3", sequence=True))  # cversion counts deletes too
    s.run("a", lambda c: c.get(f"{prefix}0000000003"))
    eph = f"{root}/eph"
    s.run("a", lambda c: c.create(eph, b"mine", ephemeral=True))
    s.run("a", lambda c: c.get(eph))
    s.run("b", lambda c: c.get(eph))
    s.run("a", lambda c: c.create(f"{eph}/child", b""))
    s.run("b", lambda c: c.create(f"{root}/eseq_", b"", ephemeral=True, sequence=True))
    s.run("b", lambda c: c.exists(eph, watch=s.watcher("b", "eph")))
    s.run("b", lambda c: c.get_children(root, watch=s.watcher("b", "root-children")))
    s.run("a", lambda c: c.get_children(root, include_data=True))
    s.stop("a")  # closing the session deletes its ephemeral at once
    s.settle()
    s.run("b", lambda c: c.exists(eph))
    s.run("b", lambda c: c.get_children(root, include_data=True))
    s.stop("b")
    s.open("c")
    s.run("c", lambda c: c.get_children(root))
    s.run("c", lambda c: c.delete(root, recursive=True))


def watches(s: Side, root: str) -> None:
    s.open("a")
    s.open("b")
    n, later = f"{root}/n", f"{root}/later"
    s.run("a", lambda c: c.create(root, b""))
    s.run("a", lambda c: c.create(n, b"0"))
    same = s.watcher("b", "data")
    s.run("b", lambda c: c.get(n, watch=same))
    s.run("b", lambda c: c.get(n, watch=same))  # the same function twice: one event
    s.run("b", lambda c: c.exists(n, watch=s.watcher("b", "exists-n")))
    s.run("b", lambda c: c.exists(later, watch=s.watcher("b", "exists-later")))
    s.run("b", lambda c: c.get(f"{root}/nope", watch=s.watcher("b", "never")))  # NoNode: no watch
    s.run("b", lambda c: c.get_children(root, watch=s.watcher("b", "children")))
    s.run("a", lambda c: c.get(n, watch=s.watcher("a", "own")))
    s.run("a", lambda c: c.set(n, b"1"))
    s.settle()
    s.run("a", lambda c: c.set(n, b"2"))  # one-shot: nobody is told again
    s.run("a", lambda c: c.create(later, b""))
    s.run("a", lambda c: c.create(f"{root}/nope", b""))
    s.settle()
    s.run("b", lambda c: c.get_children(n, watch=s.watcher("b", "n-children")))
    s.run("b", lambda c: c.get(n, watch=s.watcher("b", "n-data")))
    s.run("b", lambda c: c.get_children(root, watch=s.watcher("b", "children-2")))
    s.run("a", lambda c: c.delete(n))
    s.settle()
    calls: list[Any] = []
    s.run(
        "b",
        lambda c: c.DataWatch(later, lambda data, stat: calls.append((data, stat and stat.version))) is None,
    )
    s.run("a", lambda c: c.set(later, b"x"))
    s.settle()
    s.run("a", lambda c: c.delete(later))
    s.settle()
    s.run("a", lambda c: c.create(later, b"back"))
    s.settle()
    s.record("b", ("datawatch", tuple(calls)))
    s.run("a", lambda c: c.delete(root, recursive=True))
    s.settle()


def session_expiry(s: Side, root: str) -> None:
    s.open("a")
    s.open("b")
    eph = f"{root}/eph"
    s.run("b", lambda c: c.create(root, b""))
    s.run("a", lambda c: c.create(eph, b"", ephemeral=True))
    s.run("a", lambda c: c.get(root, watch=s.watcher("a", "root")))
    s.run("b", lambda c: c.exists(eph, watch=s.watcher("b", "eph")))
    s.cut("a")  # a hears SUSPENDED; kazoo fires and forgets its watches
    s.run("b", lambda c: c.exists(eph))  # the session lives on until its timeout
    s.expire_cut("a", "b", ("watch", "eph", "DELETED", "CONNECTED", eph))
    s.run("b", lambda c: c.exists(eph))
    s.heal("a")  # a hears LOST, then CONNECTED with a new session
    s.run("a", lambda c: c.exists(eph))
    s.run("a", lambda c: c.create(eph, b"new", ephemeral=True))
    s.run("a", lambda c: c.get(eph))
    s.run("b", lambda c: c.get(eph))
    s.run("b", lambda c: c.delete(root, recursive=True))


@pytest.mark.parametrize(
    "script", [crud_and_versions, sequential_and_ephemeral, watches, session_expiry], ids=lambda f: f.__name__
)
def test_model_matches_real_zookeeper(zookeeper: str, script: Script) -> None:
    root = f"/sim-compare-{uuid.uuid4().hex[:12]}"  # the same path on both sides
    with real_side(zookeeper) as real:
        script(real, root)
        real.settle()
    with model_side() as model:
        script(model, root)
        model.settle()
    expected, got = comparable(real.logs), comparable(model.logs)
    assert got.keys() == expected.keys()
    for log in expected:
        for step, (want, have) in enumerate(zip(expected[log], got[log], strict=False)):
            assert have == want, f"{log} step {step}: model {have}, real ZooKeeper {want}"
        assert len(got[log]) == len(expected[log]), f"{log}: model {got[log]}, real {expected[log]}"
