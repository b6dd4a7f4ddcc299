"""PySpark jobs and the ``waltz`` data source (see issue: the data pipeline on Spark).

They need the ``[spark]`` extra; without it, importing any of them says in one line how to
install it (the base install has the client, the nodes and the CLI only).
"""

from waltz_engine.common.extras import SPARK, require

require(SPARK, "the Waltz Spark data source and export", "pyspark", "pandas", "pyarrow")
