"""Spark's Python worker daemon (``pyspark.daemon``), importing pyspark from the installed
package instead of the ``pyspark.zip`` Spark puts first on the workers' ``PYTHONPATH``.

Python compiles every module imported from a zip without a bytecode cache, on every start:
``import pyspark.daemon, pyspark.worker`` took 0.98 s from the zip against 0.24 s from the
installed package (docs/benchmarks.md), paid by each worker the daemon forks, i.e. by every
fresh export. Used only with local masters (:func:`spark.export.spark_session`), where the
workers run the driver's own interpreter and its pyspark is the installation Spark runs from;
when that pyspark cannot be found, the zip stays.

Spark starts it as ``python -m spark.worker_daemon`` (``spark.python.daemon.module``).
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder

DAEMON_MODULE = "spark.worker_daemon"
PYSPARK_ZIP_NAME = "pyspark.zip"


def without_pyspark_zip(path: list[str]) -> list[str]:
    """``path`` without Spark's zip, if the installed pyspark is then found on it."""
    kept = [p for p in path if os.path.basename(p) != PYSPARK_ZIP_NAME]
    if len(kept) == len(path) or PathFinder.find_spec("pyspark", kept) is None:
        return path
    return kept


def main() -> None:
    sys.path[:] = without_pyspark_zip(sys.path)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
