"""An Iceberg table scan read one data file at a time, with one file read ahead.

pyiceberg's ``DataScan.to_arrow_batch_reader`` hands every planned file to a thread pool
at once (``executor.map``) and each worker materializes its whole file, so the batches of
every file of the snapshot are held until they are consumed: memory grows with the table
(a 50M-row bench source held ~6 GB).  Here the files are read in plan order through the
same public :class:`pyiceberg.io.pyarrow.ArrowScan`, one task per call, while one worker
thread reads the next file: at most two files' rows are in memory, whatever the table's size.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyiceberg.table import DataScan, FileScanTask

#: Files read beyond the one being consumed.
READ_AHEAD = 1


def scan_batches(scan: DataScan, read_ahead: int = READ_AHEAD) -> Iterator[pa.RecordBatch]:
    """The scan's record batches in plan order, cast to the projected schema, with at most
    ``1 + read_ahead`` data files' rows held at a time."""
    from pyiceberg.io.pyarrow import (  # noqa: PLC0415 - pyiceberg loads only for Iceberg sources
        ArrowScan,
        schema_to_pyarrow,
    )

    if scan.limit is not None:  # a limit would apply to each file's call separately
        raise ValueError("scan_batches reads whole files: a scan with a row limit is not supported")
    projected = scan.projection()
    target = schema_to_pyarrow(projected)
    reader = ArrowScan(
        scan.table_metadata,
        scan.io,
        projected,
        scan.row_filter,
        scan.case_sensitive,
        None,
    )
    tasks: Iterator[FileScanTask] = iter(scan.plan_files())

    def read(task: FileScanTask) -> list[pa.RecordBatch]:
        return list(reader.to_record_batches([task]))

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="relgate-iceberg") as pool:
        pending: list[Future[list[pa.RecordBatch]]] = []
        try:
            for task in tasks:
                pending.append(pool.submit(read, task))
                if len(pending) > read_ahead:
                    yield from _cast(pending.pop(0).result(), target)
            while pending:
                yield from _cast(pending.pop(0).result(), target)
        finally:
            for future in pending:
                future.cancel()


def _cast(batches: list[pa.RecordBatch], target: pa.Schema) -> Iterator[pa.RecordBatch]:
    while batches:
        yield batches.pop(0).cast(target)
