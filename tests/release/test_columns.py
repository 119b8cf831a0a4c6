"""The column-at-a-time record paths against the row-at-a-time references.

Canonical value bytes per Arrow type and content digests through the hashing kernel agree
with :mod:`support.record_reference` per record (slices and chunks included); the writer's
logical digest (from the proven content column) agrees with the one recomputed from the
content and with the reference encoding; shards verified in threads, in spawned processes
and in this thread give the same results.
"""

import hashlib
import re

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import corpora
from support import record_reference as ref
from support.releases import write

from relgate.catalog.snapshot_table import get_snapshot
from relgate.documents import shard_format as rr
from relgate.documents import snapshot_manifest as sm
from relgate.errors import RejectedError, UsageError
from relgate.records.record_schema import FieldSpec, arrow_type, type_name
from relgate.records.values import canonical_column, content_digests
from relgate.release.verify.worker import PROCESS, THREAD, ShardTask, run_shards
from relgate.snapshot import tokenizer

texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
rows = st.lists(st.tuples(st.sampled_from(["en", "de", "", "pt-BR"]), texts), max_size=30)
spaced = st.text(alphabet=st.sampled_from(["a", "é", " ", "\t", "\n", "\x00", "\x1f", "!"]))


def string_array(values, start):
    """``values`` as a string array; ``start`` > 0 makes it a slice (non-zero offset)."""
    arr = pa.array(["pad"] * start + values, pa.string())
    return arr.slice(start)


@settings(max_examples=150, deadline=None)
@given(rows, st.integers(0, 3))
def test_content_digests_match_the_row_reference(records, start):
    lang = string_array([r[0] for r in records], start)
    text = string_array([r[1] for r in records], start)
    schema = corpora.TEXT
    expected = [ref.content_digest({"lang": la, "text": t}, schema) for la, t in records]
    got = content_digests(pa.table({"lang": lang, "text": text}), schema)
    assert got.type == pa.string()
    assert got.to_pylist() == expected
    chunked = pa.chunked_array([text.slice(0, len(text) // 2), text.slice(len(text) // 2)])
    table = pa.table({"lang": lang, "text": chunked})
    assert content_digests(table, schema).to_pylist() == expected


VALUES = {
    "string": st.text(max_size=8),
    "large_string": st.text(max_size=8),
    "binary": st.binary(max_size=8),
    "large_binary": st.binary(max_size=8),
    "bool": st.booleans(),
    "int8": st.integers(-(2**7), 2**7 - 1),
    "int16": st.integers(-(2**15), 2**15 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "uint8": st.integers(0, 2**8 - 1),
    "uint16": st.integers(0, 2**16 - 1),
    "uint32": st.integers(0, 2**32 - 1),
    "uint64": st.integers(0, 2**64 - 1),
    "float32": st.floats(width=32, allow_nan=False),
    "float64": st.floats(allow_nan=False),
    "list<uint32>": st.lists(st.integers(0, 2**32 - 1), max_size=6),
    "large_list<int64>": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6),
    "list<float32>": st.lists(st.floats(width=32, allow_nan=False), max_size=4),
}


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_canonical_column_matches_the_value_reference(data):
    """Every type of the grammar, nullable or not, sliced or not, agrees value by value."""
    type_name = data.draw(st.sampled_from(sorted(VALUES)))
    nullable = data.draw(st.booleans())
    value = VALUES[type_name] | st.none() if nullable else VALUES[type_name]
    values = data.draw(st.lists(value, max_size=8))
    pad = data.draw(st.integers(0, 2))
    dtype = arrow_type(type_name)
    filler = data.draw(st.lists(VALUES[type_name], min_size=pad, max_size=pad))
    column = pa.array(filler + values, dtype).slice(pad)
    spec = FieldSpec(name="c", type=type_name, nullable=nullable)
    got = canonical_column(column, spec).to_pylist()
    assert got == [ref.value_bytes(v, type_name, nullable) for v in values]


@settings(max_examples=150, deadline=None)
@given(st.lists(spaced, max_size=12), st.integers(0, 3))
def test_token_counts_match_a_regex_reference(values, start):
    expected = [len(re.findall(rb"[^\x00-\x20]+", v.encode())) for v in values]
    table = pa.table({"text": string_array(values, start)})
    assert rr.ShardFormat(corpora.TEXT).token_counts(table, None).to_pylist() == expected


text = st.text(max_size=12)
record = st.tuples(text, text, text, text, text, text, st.integers(0, 2**40))


@settings(max_examples=100, deadline=None)
@given(st.lists(record, max_size=6))
def test_logical_digest_from_a_proven_content_column(records):
    """The writer's shortcut: a content column equal to the recomputed one, same digest."""
    fmt = rr.ShardFormat(corpora.TEXT)
    names = ("sampleId", "sourceId", "sourceVersion", "split", "lang", "text", "tokens")
    rows = [dict(zip(names, r, strict=True)) for r in records]
    proven = [{**r, "logicalContentDigest": ref.content_digest(r, corpora.TEXT)} for r in rows]
    table = pa.Table.from_pylist(proven, schema=fmt.arrow_schema)
    expected = hashlib.sha256(ref.stream_bytes(fmt.header, corpora.TEXT, proven)).hexdigest()
    assert fmt.logical_digest(table, table.column("logicalContentDigest")) == "sha256:" + expected
    assert fmt.logical_digest(table) == "sha256:" + expected


def comparable(result):
    entry = result.to_json()
    entry.pop("readMicros")
    return entry, result.tuples


def test_shards_verified_in_threads_processes_and_inline_agree(ws, snapshot):
    release = write(ws, snapshot.digest)
    row = get_snapshot(ws.db, snapshot.digest)
    snap = sm.load(ws.store, ws.trusted_keys, snapshot.digest, row.envelope_version)
    tokenizer_bytes = tokenizer.pinned_bytes(ws, snap)
    tasks = [
        ShardTask(
            ws.config["objectStore"],
            d,
            snapshot.digest,
            snap.record_schema_document,
            snap.record_schema,
            None,
            tokenizer=tokenizer_bytes,
        )
        for d in release.document()["shards"]
    ]
    inline = [comparable(r) for r in run_shards(tasks, 0)]
    assert all(entry["ok"] for entry, _ in inline) and len(inline) > 1
    for workers, mode in ((2, THREAD), (2, PROCESS)):
        assert [comparable(r) for r in run_shards(tasks, workers, mode=mode)] == inline


NAMES = sorted(VALUES)


@given(st.sampled_from(NAMES))
def test_type_names_round_trip_through_arrow(name):
    """Every name of the grammar spells exactly one Arrow type and back (list is not
    large_list: the Arrow layouts differ even where the canonical bytes agree)."""
    assert type_name(arrow_type(name)) == name
    assert arrow_type("list<uint32>") == pa.list_(pa.uint32())
    assert arrow_type("large_list<uint32>") == pa.large_list(pa.uint32())


@pytest.mark.parametrize(
    "name",
    [
        "map<string,int>",
        "list<bool>",
        "list<string>",
        "struct<a:int32>",
        "List<uint32>",
        "list<uint32>\n",  # a trailing newline is not the name ($ would have let it by)
    ],
)
def test_types_outside_the_grammar_are_refused(name):
    with pytest.raises(UsageError) as err:
        arrow_type(name)
    assert err.value.check == "record-schema"


def test_a_null_where_the_schema_forbids_one_is_refused_not_encoded_as_empty():
    spec = FieldSpec(name="text", type="string")
    with pytest.raises(RejectedError) as err:
        canonical_column(pa.array(["a", None]), spec)
    assert err.value.check == "record-schema" and err.value.object == "text"
    ids = FieldSpec(name="ids", type="list<uint32>")
    with pytest.raises(RejectedError):
        canonical_column(pa.array([[1, None]], pa.list_(pa.uint32())), ids)


def test_a_sliced_list_column_reads_only_its_own_elements():
    """Elements of rows outside the slice (a null among them) are not the slice's."""
    full = pa.array([[1, 2], [3], [None, 4]], pa.list_(pa.uint32()))
    spec = FieldSpec(name="ids", type="list<uint32>")
    got = canonical_column(full.slice(1, 1), spec).to_pylist()
    assert got == [ref.value_bytes([3], "list<uint32>")]
    got = canonical_column(full.slice(0, 2), spec).to_pylist()
    assert got == [ref.value_bytes([1, 2], "list<uint32>"), ref.value_bytes([3], "list<uint32>")]
