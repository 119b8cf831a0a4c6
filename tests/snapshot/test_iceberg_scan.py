"""An Iceberg scan read one data file at a time: the same rows in the same order as
pyiceberg's own reader, never more than one file read ahead of the consumer (pyiceberg's
``to_arrow_batch_reader`` reads every file of the snapshot at once), and a scan with a row
limit refused rather than limited per file."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import ArrowScan

from relgate.sources.iceberg import open_catalog
from relgate.sources.iceberg_scan import scan_batches

FILES = 6
ROWS = 50
SCHEMA = pa.schema([("sample_id", pa.string()), ("n", pa.int64())])


@pytest.fixture
def table(tmp_path: Path) -> Any:
    (tmp_path / "warehouse").mkdir()
    catalog = open_catalog(f"sqlite:///{tmp_path / 'cat.db'}", f"file://{tmp_path / 'warehouse'}")
    catalog.create_namespace("t")
    # ten-row row groups: every data file reads back as several batches
    made = catalog.create_table(
        "t.rows", schema=SCHEMA, properties={"write.parquet.row-group-limit": "10"}
    )
    for f in range(FILES):  # one append, one data file
        ids = [f"f{f}/{i:03d}" for i in range(ROWS)]
        made.append(pa.table([ids, [f * ROWS + i for i in range(ROWS)]], schema=SCHEMA))
    return catalog.load_table("t.rows")


@pytest.mark.parametrize("read_ahead", [0, 1, 2, 10])
def test_same_rows_in_the_same_order_as_pyiceberg(table: Any, read_ahead: int) -> None:
    scan = table.scan()
    ours = pa.Table.from_batches(list(scan_batches(scan, read_ahead=read_ahead)))
    theirs = scan.to_arrow_batch_reader().read_all()
    assert ours.num_rows == FILES * ROWS
    assert len(list(scan_batches(scan, read_ahead=read_ahead))) > FILES  # batches per file
    assert ours.column("sample_id").to_pylist() == theirs.column("sample_id").to_pylist()
    assert ours.column("n").to_pylist() == theirs.column("n").to_pylist()
    assert ours.schema == theirs.schema


@pytest.mark.parametrize("read_ahead", [0, 1, 2, None])
def test_at_most_read_ahead_files_beyond_the_one_consumed(
    table: Any, read_ahead: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``None``: the default, one file ahead."""
    started: list[str] = []
    lock = threading.Lock()
    real = ArrowScan.to_record_batches

    def counted(self: ArrowScan, tasks: Any) -> Any:
        tasks = list(tasks)
        with lock:
            started.extend(t.file.file_path for t in tasks)
        return real(self, tasks)

    monkeypatch.setattr(ArrowScan, "to_record_batches", counted)
    seen: list[str] = []
    batches = (
        scan_batches(table.scan()) if read_ahead is None else scan_batches(table.scan(), read_ahead)
    )
    ahead = 1 if read_ahead is None else read_ahead
    for batch in batches:
        file_prefix = str(batch.column("sample_id")[0]).partition("/")[0]
        if file_prefix not in seen:
            seen.append(file_prefix)
            # give the reader thread time to run as far ahead as it is allowed to (the
            # bound holds whatever the timing; the pause lets a broken bound show)
            time.sleep(0.05)
        with lock:
            assert len(started) <= len(seen) + ahead, (started, seen)
    assert len(seen) == FILES
    assert len(started) == FILES


def test_a_row_limit_is_refused(table: Any) -> None:
    with pytest.raises(ValueError, match="row limit"):
        next(scan_batches(table.scan(limit=5)))
