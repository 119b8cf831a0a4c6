"""The IPC protocol carries whatever columns records have (token ids, binary), once per build."""

import polars as pl
import pyarrow as pa
import pytest
from support import transforms as art

from relgate.documents.source_pins import SourcePin
from relgate.sources.source import Source
from relgate.transforms.exchange import narrow_schema
from relgate.transforms.pinned import PinnedTransform
from relgate.transforms.registry import register_wheel

DROP_EMPTY = """
import pyarrow.compute as pc

def transform(batch):
    return batch.filter(pc.greater(pc.list_value_length(batch.column("tokens")), 0))
"""
TOKENS = pa.schema(
    [
        ("sampleId", pa.string()),
        ("tokens", pa.list_(pa.uint32())),
        ("blob", pa.binary()),
        ("sourceVersion", pa.string()),
    ]
)


class _Rows(Source):
    """An in-memory source of fixed tables (the pin is not exercised here)."""

    kind = "memory"

    def __init__(self, source_id, tables):
        super().__init__(source_id)
        self.tables = tables

    def pin(self) -> SourcePin:  # pragma: no cover - not called
        raise NotImplementedError

    def read(self, entry):
        return pa.concat_tables(self.tables)

    def read_batches(self, entry):
        yield from self.tables

    def check_readable(self, entry):
        return []


class _Entry:
    def __init__(self, source_id):
        self.id = source_id


def _table(prefix, n):
    return pa.table(
        {
            "sampleId": [f"{prefix}/{i}" for i in range(n)],
            "tokens": [list(range(i % 3)) for i in range(n)],
            "blob": [bytes([i % 256]) * (i % 4) for i in range(n)],
            "sourceVersion": ["v1"] * n,
        },
        schema=TOKENS,
    )


@pytest.fixture
def transform(ws, tmp_path):
    def make(body):
        spec = register_wheel(ws.db, ws.cas, art.write_wheel(tmp_path, "t-tok", "1.0", body))
        return PinnedTransform(f"registry.local/tok@{spec.pin}", spec, ws.cas)

    return make


def test_token_ids_and_binary_pass_through_a_batch_call_unchanged(transform):
    frame = pl.DataFrame(_table("a", 50)).with_columns(pl.lit("src").alias("sourceId"))
    with transform(art.IDENTITY) as pinned:
        out = pinned(frame.lazy()).collect()
    assert (
        out.to_arrow()
        .cast(narrow_schema(out.to_arrow().schema))
        .equals(frame.to_arrow().cast(narrow_schema(frame.to_arrow().schema)))
    )


def test_a_whole_build_runs_once_and_each_source_reads_its_own_output(transform):
    sources = {
        "a": _Rows("a", [_table("a", 30), _table("a2", 20)]),
        "b": _Rows("b", [_table("b", 40)]),
    }
    entries = [_Entry("a"), _Entry("b")]
    with transform(DROP_EMPTY) as pinned, pinned.staged(sources, entries) as staged:
        assert (staged.facts.rows_in, staged.facts.rows_out) == (90, 90 - 31)
        got_a = pa.concat_tables(staged.sources["a"].read_batches(entries[0]))
        got_b = staged.sources["b"].read(entries[1])
    assert got_a.schema == TOKENS and got_b.schema == TOKENS
    assert got_a.num_rows == 50 - 17 and got_b.num_rows == 40 - 14
    assert all(len(t) > 0 for t in got_a["tokens"].to_pylist())
    assert set(got_b["sampleId"].to_pylist()) <= {f"b/{i}" for i in range(40)}
