"""The columns of the ``waltz`` data source, as a Spark schema and as the Arrow schema it maps to.

Every column is NOT NULL: a stored record always has all of them (empty data is ``b""``).
The Arrow schema is derived with pyspark's own conversion so the batches the reader yields
are exactly what the Python data source worker checks them against.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

COLUMN_PARTITION = "partition"
COLUMN_TRANSACTION_ID = "transaction_id"
COLUMN_CLIENT_ID = "client_id"
COLUMN_GENERATION = "generation"
COLUMN_SEQ_NUM = "seq_num"
COLUMN_HEADER = "header"
COLUMN_DATA = "data"
COLUMN_CHECKSUM = "checksum"
# Added by ``waltz spark export --decoder``.
COLUMN_DECODED = "decoded"

SPARK_SCHEMA = StructType(
    [
        StructField(COLUMN_PARTITION, IntegerType(), nullable=False),
        StructField(COLUMN_TRANSACTION_ID, LongType(), nullable=False),
        StructField(COLUMN_CLIENT_ID, IntegerType(), nullable=False),
        StructField(COLUMN_GENERATION, IntegerType(), nullable=False),
        StructField(COLUMN_SEQ_NUM, IntegerType(), nullable=False),
        StructField(COLUMN_HEADER, IntegerType(), nullable=False),
        StructField(COLUMN_DATA, BinaryType(), nullable=False),
        StructField(COLUMN_CHECKSUM, IntegerType(), nullable=False),
    ]
)
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SPARK_SCHEMA, timezone="UTC")
