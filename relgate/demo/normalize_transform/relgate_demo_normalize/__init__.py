"""The demo transform: NFC, collapse runs of whitespace, trim; language codes lower-cased.

A relgate transform entry point takes one ``pyarrow.RecordBatch`` and returns a batch or
table with exactly the same schema, record by record (relgate refuses anything else).
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa


def transform(batch: pa.RecordBatch) -> pa.Table:
    frame = pl.DataFrame(pa.Table.from_batches([batch]))
    frame = frame.with_columns(
        pl.col("text").str.normalize("NFC").str.replace_all(r"\s+", " ").str.strip_chars(),
        pl.col("lang").str.to_lowercase().str.strip_chars(),
    )
    return frame.to_arrow().cast(batch.schema)
