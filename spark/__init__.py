"""PySpark jobs and the ``waltz`` data source (see issue: the data pipeline on Spark)."""
