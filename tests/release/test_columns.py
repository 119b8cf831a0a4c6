"""The column-at-a-time verifier and writer paths against the row-at-a-time references.

Content digests through the hashing kernel (as ``sha256:<hex>`` strings) agree with
:func:`relgate.sources.schema.content_digest` per record; the writer's logical digest (from the proven content column) agrees with the one recomputed from the text and
with the reference encoding; shards verified in threads, in spawned processes and in this
thread give the same results.
"""

import hashlib
import re

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from support.releases import write

from relgate.catalog.snapshot_table import get_snapshot
from relgate.release import stream as rr
from relgate.release.verify_worker import PROCESS, THREAD, ShardTask, run_shards
from relgate.snapshot import manifest as sm
from relgate.sources.schema import content_digest

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
    expected = [content_digest(la, t) for la, t in records]
    got = rr.content_digests(lang, text)
    assert got.type == pa.string()
    assert got.to_pylist() == expected
    chunked = pa.chunked_array([text.slice(0, len(text) // 2), text.slice(len(text) // 2)])
    assert rr.content_digests(lang, chunked).to_pylist() == expected


@settings(max_examples=150, deadline=None)
@given(st.lists(spaced, max_size=12), st.integers(0, 3))
def test_token_counts_match_a_regex_reference(values, start):
    expected = [len(re.findall(rb"[^\x00-\x20]+", v.encode())) for v in values]
    assert rr.token_counts(string_array(values, start)).to_pylist() == expected


text = st.text(max_size=12)
record = st.tuples(text, text, text, text, text, text, text, st.integers(0, 2**40))


@settings(max_examples=100, deadline=None)
@given(st.lists(record, max_size=6))
def test_logical_digest_from_a_proven_content_column(records):
    """The writer's shortcut: a content column equal to the recomputed one, same digest."""
    proven = [(*r[:3], content_digest(r[5], r[6]), *r[4:]) for r in records]
    table = pa.Table.from_pylist(
        [dict(zip(rr.COLUMNS, r, strict=True)) for r in proven], schema=rr.SHARD_ARROW_SCHEMA
    )
    expected = "sha256:" + hashlib.sha256(rr.encode_stream(proven)).hexdigest()
    assert rr.logical_digest(table, table.column("logicalContentDigest")) == expected
    assert rr.logical_digest(table) == expected


def comparable(result):
    entry = result.to_json()
    entry.pop("readMicros")
    return entry, result.tuples


def test_shards_verified_in_threads_processes_and_inline_agree(ws, snapshot):
    release = write(ws, snapshot.digest)
    row = get_snapshot(ws.db, snapshot.digest)
    snap = sm.load(ws.store, ws.trusted_keys, snapshot.digest, row["envelope_version"])
    tasks = [
        ShardTask(
            ws.config["objectStore"],
            d,
            snapshot.digest,
            release.body["recordSchema"],
            str(snap.body["recordSchema"]),
            None,
        )
        for d in release.body["shards"]
    ]
    inline = [comparable(r) for r in run_shards(tasks, 0)]
    assert all(entry["ok"] for entry, _ in inline) and len(inline) > 1
    for workers, mode in ((2, THREAD), (2, PROCESS)):
        assert [comparable(r) for r in run_shards(tasks, workers, mode=mode)] == inline
