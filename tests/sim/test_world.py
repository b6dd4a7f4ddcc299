"""A simulated cluster of real storage nodes, a real server and a real client on one SimLoop:
appends read back, checked, and the same seed always the same run."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from waltz_cli.main import app
from waltz_engine.client import Transaction
from waltz_engine.sim.runner import run_seeds
from waltz_engine.sim.world import DEFAULT_TRANSACTIONS, SimWorld, WorldShape, run_seed


def test_a_seed_appends_and_applies_every_transaction_once() -> None:
    result = run_seed(7)
    assert result.violations == []
    assert result.transactions == DEFAULT_TRANSACTIONS
    assert result.virtual_s > 0


def test_one_seed_one_run_and_seeds_differ() -> None:
    shape = WorldShape(transactions=20)
    first, again, other = (run_seed(seed, shape) for seed in (11, 11, 12))
    assert first.trace_hash == again.trace_hash != other.trace_hash
    assert first.virtual_s == again.virtual_s


def test_an_application_that_applies_twice_is_caught_with_the_last_events() -> None:
    def apply_twice(world: SimWorld) -> None:
        apply = world.application.apply_transaction

        def twice(transaction: Transaction) -> None:
            apply(transaction)
            apply(transaction)

        world.application.apply_transaction = twice  # type: ignore[method-assign]

    result = run_seed(3, WorldShape(transactions=5), on_world=apply_twice)
    assert "transaction 0 is in the log 2 times" in result.violations
    assert any(v.startswith("partition 0: txids not dense from 0") for v in result.violations)
    assert result.last_events and all("s " in event for event in result.last_events)


def test_seeds_over_processes_give_the_same_report() -> None:
    one, two = run_seeds(2, seed_base=40, jobs=1), run_seeds(2, seed_base=40, jobs=2)
    assert one.trace_hash == two.trace_hash and one.passed and two.passed
    assert one.transactions == two.transactions == 2 * DEFAULT_TRANSACTIONS


def test_waltz_sim_json() -> None:
    result = CliRunner().invoke(app, ["sim", "--seeds", "2", "--seed-base", "5", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["seeds"] == 2 and report["violations"] == [] and report["failing_seeds"] == []
    assert report["transactions"] == 2 * DEFAULT_TRANSACTIONS
    again = json.loads(CliRunner().invoke(app, ["sim", "--seeds", "2", "--seed-base", "5", "--json"]).stdout)
    assert again["trace_hash"] == report["trace_hash"]
