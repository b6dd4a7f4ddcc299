"""`waltz bench compare`: two saved reports, every common figure with new/old."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cluster_support import run_waltz_cli
from typer.testing import CliRunner

from waltz_cli.main import app
from waltz_engine.bench.compare import compare, flatten

CLI_TIMEOUT_S = 60.0
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


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"Appended 6 transactions, with total 0.1 MB\n", "not JSON"),
        (b"[1, 2, 3]", "JSON list, not an object"),
        (b"42", "JSON int, not an object"),
        (b"null", "JSON null, not an object"),
        (b'{"machine": {"cpus": 2}, "name": "no figures"}', "holds no figure"),
        (b"\xff\xfe\x00binary", "not text"),
        (None, "cannot read"),  # a missing file
        (b"", "not JSON"),
    ],
)
def test_a_file_that_is_not_a_saved_report_is_one_line(
    tmp_path: Path, content: bytes | None, says: str
) -> None:
    good, other = tmp_path / "good.json", tmp_path / "other"
    good.write_text(json.dumps(OLD))
    if content is not None:
        other.write_bytes(content)
    for args in ([good, other], [other, good]):
        result = CliRunner().invoke(app, ["bench", "compare", *map(str, args)])
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output and result.stdout == ""
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("error: ") and says in line and str(other) in line, line


def test_a_directory_is_not_a_report(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(OLD))
    result = CliRunner().invoke(app, ["bench", "compare", str(good), str(tmp_path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.strip() == f"error: cannot read {tmp_path}: Is a directory"


def test_a_plain_text_file_in_a_real_process(tmp_path: Path) -> None:
    good, text = tmp_path / "good.json", tmp_path / "notes.txt"
    good.write_text(json.dumps(OLD))
    text.write_text("producers were faster today\n")
    result = run_waltz_cli("bench", "compare", str(good), str(text), timeout_s=CLI_TIMEOUT_S)
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {text} is not a saved benchmark report (not JSON"), line
