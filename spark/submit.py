"""Running an export on a Spark cluster: ``spark-submit`` (from the pyspark wheel) with the
engine shipped to the executors as a zip (``--py-files``), the run's config and summary
passed as JSON files. The submitted driver is :func:`job_main`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

import spark as spark_package
import waltz_engine
from spark.datasource import register
from spark.export import ExportConfig, ExportError, ExportSummary, run_export, task_failure
from spark.watermarks import state_dir

SHIPPED_PACKAGES = (waltz_engine, spark_package)
ENGINE_ZIP_NAME = "waltz-engine.zip"
LAUNCHER_NAME = "waltz_export_job.py"
# Kept in the output's state directory: the last submitted run's driver log.
SUBMIT_LOG_NAME = "spark-submit.log"
_MASTER_UNREACHABLE = re.compile(r"Failed to connect to master (\S+)")
# The launcher lives outside the package so the package's directory is not put first on the
# driver's sys.path (its module names would shadow top-level ones).
LAUNCHER_SOURCE = "from spark.submit import job_main\njob_main()\n"


def spark_submit_path() -> Path:
    return Path(pyspark.__file__).parent / "bin" / "spark-submit"


def build_engine_zip(directory: Path) -> Path:
    """The Python sources of the engine and of this package, importable from a zip."""
    target = directory / ENGINE_ZIP_NAME
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in SHIPPED_PACKAGES:
            assert package.__file__ is not None, f"{package.__name__} is not a regular package"
            root = Path(package.__file__).parent
            for source in sorted(root.rglob("*.py")):
                archive.write(source, source.relative_to(root.parent))
    return target


def submit_command(master: str, work_dir: Path, config_path: Path, summary_path: Path) -> list[str]:
    launcher = work_dir / LAUNCHER_NAME
    launcher.write_text(LAUNCHER_SOURCE)
    return [
        str(spark_submit_path()),
        "--master",
        master,
        "--name",
        "waltz-export",
        "--py-files",
        str(build_engine_zip(work_dir)),
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        "--conf",
        "spark.ui.showConsoleProgress=false",
        str(launcher),
        "--config",
        str(config_path),
        "--summary",
        str(summary_path),
    ]


def submit_export(config: ExportConfig, master: str, log_path: Path | None = None) -> ExportSummary:
    """Run the export as a Spark application on ``master``; its log goes to ``log_path``."""
    with tempfile.TemporaryDirectory(prefix="waltz-submit-") as temporary:
        work_dir = Path(temporary)
        config_path, summary_path = work_dir / "config.json", work_dir / "summary.json"
        config_path.write_text(json.dumps(config.to_json()))
        log = log_path or state_dir(config.output) / SUBMIT_LOG_NAME
        log.parent.mkdir(parents=True, exist_ok=True)
        environment = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_HOME": str(Path(pyspark.__file__).parent),
        }
        with log.open("w") as out:
            result = subprocess.run(
                submit_command(master, work_dir, config_path, summary_path),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=environment,
                check=False,
            )
        if result.returncode != 0 or not summary_path.is_file():
            reason = submit_failure(log.read_text(errors="replace"))
            raise ExportError(
                f"spark-submit to {master} failed (exit {result.returncode}), nothing was committed: "
                f"{reason} (log: {log})"
            )
        summary: ExportSummary = ExportSummary.from_json(json.loads(summary_path.read_text()))
        return summary


def submit_failure(log: str) -> str:
    """Why a submitted run failed, in one line, from its driver log."""
    unreachable = _MASTER_UNREACHABLE.search(log)
    if unreachable is not None:
        master = unreachable.group(1)
        return f"cannot connect to the Spark master {master} (is it running, and is the URL right?)"
    last = next((line.strip() for line in reversed(log.splitlines()) if line.strip()), "no output")
    return task_failure(log) or last


def job_main(argv: Sequence[str] | None = None) -> None:
    """The submitted driver: run one export, write its summary."""
    parser = argparse.ArgumentParser(prog=LAUNCHER_NAME)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--summary", type=Path, required=True)
    args = parser.parse_args(argv)
    config = ExportConfig.from_json(json.loads(args.config.read_text()))
    session = _submitted_session()
    try:
        summary = run_export(session, config)
    finally:
        session.stop()
    args.summary.write_text(json.dumps(summary.to_json()))


def _submitted_session() -> SparkSession:
    """spark-submit sets the master; only register the source."""
    session = SparkSession.builder.getOrCreate()
    register(session)
    return session
