"""``dumps_indented`` writes exactly what ``json.dumps(value, indent=N)`` writes."""

from __future__ import annotations

import enum
import json
import math
import random
from typing import Any

import pytest

from waltz_engine.common.json_text import dumps_indented
from waltz_engine.common.metrics import MetricsRegistry


class _Flag(enum.IntEnum):
    ON = 1


def _value(rng: random.Random, depth: int) -> Any:
    kinds = ["str", "int", "float", "none", "bool", "special"] + (
        ["list", "tuple", "dict"] * 2 if depth < 4 else []
    )
    kind = rng.choice(kinds)
    if kind == "str":
        return "".join(rng.choice('ab"\\\n\té€😀\x00/') for _ in range(rng.randrange(6)))
    if kind == "int":
        return rng.choice([0, -1, 2**70, rng.randrange(-(10**9), 10**9), _Flag.ON])
    if kind == "float":
        return rng.choice([0.0, -0.0, 1e300, 1.5e-7, rng.uniform(-1e6, 1e6)])
    if kind == "special":
        return rng.choice([math.inf, -math.inf, math.nan])
    if kind in ("none", "bool"):
        return rng.choice([None, True, False])
    items = [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == "list":
        return items
    if kind == "tuple":
        return tuple(items)
    keys = [rng.choice(["k", "é", 'q"', 7, -2.5, True, False, None]) for _ in items]
    return dict(zip(keys, items, strict=True))


@pytest.mark.parametrize("indent", [0, 1, 2, 4])
def test_the_text_of_json_dumps(indent: int) -> None:
    rng = random.Random(indent)
    for _ in range(500):
        value = _value(rng, 0)
        assert dumps_indented(value, indent) == json.dumps(value, indent=indent)


def test_a_metrics_registry() -> None:
    registry = MetricsRegistry()
    registry.gauge("g", "ids", lambda: [0, 1, 2])
    registry.gauge("g", "none", lambda: None)
    registry.gauge("g", "spans", lambda: {"0": {"first": 1, "last": 9}})
    registry.counter("c", "n").inc(3)
    registry.meter("m", "append").mark(5)
    registry.timer("t", "latency").update_ms(1.25)
    value = registry.to_json()
    assert dumps_indented(value, 2) == json.dumps(value, indent=2)


def test_what_json_refuses_it_refuses_alike() -> None:
    for value in ({"a": object()}, {(1, 2): 3}, [b"bytes"]):
        with pytest.raises(TypeError):
            dumps_indented(value, 2)
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Circular reference"):
        dumps_indented(cycle, 2)
