"""`waltz bench compare`: two saved reports, every common figure with new/old."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from waltz_cli.main import app
from waltz_engine.bench.compare import compare, flatten

OLD = {
    "machine": {"cpus": 2},
    "results": [{"implementation": "a", "mb_per_s": 100.0}, {"batch": 10, "rec_s": 50}],
}
NEW = {
    "machine": {"cpus": 4},
    "results": [{"batch": 10, "rec_s": 75}, {"implementation": "a", "mb_per_s": 50.0}],
}


def test_figures_are_matched_by_their_labels_not_positions() -> None:
    ratios = {c.metric: c.ratio for c in compare(OLD, NEW)}
    assert ratios == {"results[10].batch": 1.0, "results[10].rec_s": 1.5, "results[a].mb_per_s": 0.5}
    assert "machine.cpus" not in flatten(OLD)


def test_cli_prints_ratios_and_refuses_bad_input(tmp_path: Path) -> None:
    old, new, bad = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "bad.json"
    old.write_text(json.dumps(OLD))
    new.write_text(json.dumps(NEW))
    bad.write_text("{")
    result = CliRunner().invoke(app, ["bench", "compare", str(old), str(new), "--json"])
    assert result.exit_code == 0, result.output
    figures = {f["metric"]: f["ratio"] for f in json.loads(result.stdout)["figures"]}
    assert figures["results[a].mb_per_s"] == 0.5
    table = CliRunner().invoke(app, ["bench", "compare", str(old), str(new)])
    assert "results[a].mb_per_s" in table.stdout and "0.50" in table.stdout
    for args in ([str(old), str(bad)], [str(old), str(tmp_path / "missing.json")]):
        failed = CliRunner().invoke(app, ["bench", "compare", *args])
        assert failed.exit_code == 1 and "Traceback" not in failed.output
        assert len(failed.stderr.strip().splitlines()) == 1
    unrelated = tmp_path / "unrelated.json"
    unrelated.write_text(json.dumps({"x": 1}))
    assert CliRunner().invoke(app, ["bench", "compare", str(old), str(unrelated)]).exit_code == 1
