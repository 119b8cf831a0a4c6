"""The canonical record stream: injective, stable, and the vectorised digest agrees with
the row-at-a-time reference encoding, for text, token-id and binary record schemas."""

import hashlib

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from support import corpora
from support import record_reference as ref

from relgate.documents import shard_format as rr

text = st.text(max_size=12)
TEXT_FORMAT = rr.ShardFormat(corpora.TEXT)
TOKEN_FORMAT = rr.ShardFormat(corpora.TOKENS)
BINARY_FORMAT = rr.ShardFormat(corpora.BINARY)

tuple_part = st.fixed_dictionaries(
    {
        "sampleId": text,
        "sourceId": text,
        "sourceVersion": text,
        "logicalContentDigest": text,
        "split": text,
        "tokens": st.integers(0, 2**40),
    }
)
text_record = st.builds(
    lambda base, lang, body: {**base, "lang": lang, "text": body}, tuple_part, text, text
)
token_record = st.builds(
    lambda base, ids, domain: {**base, "ids": ids, "domain": domain},
    tuple_part,
    st.lists(st.integers(0, 2**32 - 1), max_size=8),
    text,
)
binary_record = st.builds(
    lambda base, image, caption, w, score: {
        **base,
        "image": image,
        "mime": "image/png",
        "width": w,
        "height": -w,
        "score": score,
        "caption": caption,
        "label": "cat",
    },
    tuple_part,
    st.binary(max_size=16),
    st.none() | text,
    st.integers(-(2**31) + 1, 2**31 - 1),
    st.floats(allow_nan=False),
)
FORMATS = ((TEXT_FORMAT, text_record), (TOKEN_FORMAT, token_record), (BINARY_FORMAT, binary_record))


def as_table(fmt, records):
    return pa.Table.from_pylist(records, schema=fmt.arrow_schema)


def canonical(fmt, records):
    """The stream's content: the stored digest column is not part of it (it is recomputed)."""
    schema = fmt.records
    return [
        (
            r["sampleId"],
            r["sourceId"],
            r["sourceVersion"],
            ref.content_digest(r, schema),
            r["split"],
            tuple(
                ref.value_bytes(r[a], schema.field(a).type, schema.field(a).nullable)
                for a in schema.attributes
            ),
            r["tokens"],
        )
        for r in records
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(text_record, max_size=5), st.lists(text_record, max_size=5))
def test_stream_encoding_is_injective(a, b):
    header = TEXT_FORMAT.header
    same_bytes = ref.stream_bytes(header, corpora.TEXT, a) == ref.stream_bytes(
        header, corpora.TEXT, b
    )
    assert same_bytes == (canonical(TEXT_FORMAT, a) == canonical(TEXT_FORMAT, b))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_vectorised_digest_matches_reference_encoding(data):
    for fmt, strategy in FORMATS:
        records = data.draw(st.lists(strategy, max_size=5))
        expected = hashlib.sha256(ref.stream_bytes(fmt.header, fmt.records, records)).hexdigest()
        assert fmt.logical_digest(as_table(fmt, records)) == "sha256:" + expected


@settings(max_examples=100, deadline=None)
@given(st.lists(token_record, max_size=5))
def test_member_set_digest_ignores_record_order(records):
    table = as_table(TOKEN_FORMAT, records)
    reversed_table = table.take(pa.array(list(range(table.num_rows))[::-1], pa.int64()))
    schema = "sha256:" + "0" * 64
    assert rr.member_set_digest(table, schema) == rr.member_set_digest(reversed_table, schema)


def _reference_member_set(records, schema: str, content=None) -> str:
    """Sorted tuple encodings (Python bytes order), hashed after the members header."""
    digests = content if content is not None else [r["logicalContentDigest"] for r in records]
    encoded = sorted(
        ref.lp(
            [
                r["sampleId"].encode(),
                r["sourceId"].encode(),
                r["sourceVersion"].encode(),
                d.encode(),
                r["split"].encode(),
                schema.encode(),
            ]
        )
        for r, d in zip(records, digests, strict=True)
    )
    return (
        "sha256:" + hashlib.sha256(b"relgate.shard.members.v1\x00" + b"".join(encoded)).hexdigest()
    )


# Few distinct short values (duplicates, prefixes of each other, equal lengths), bytes
# above 0x7f (an unsigned byte order), and the empty string.
member_text = st.sampled_from(["", "a", "ab", "b", "\u00e9", "\u00ff", "a\x00", "zz", "\U0001f600"])
member_record = st.fixed_dictionaries(
    {
        "sampleId": member_text,
        "sourceId": member_text,
        "sourceVersion": member_text,
        "logicalContentDigest": member_text,
        "split": member_text,
        "tokens": st.just(0),
        "ids": st.just([]),
        "domain": st.just(""),
    }
)


@settings(max_examples=300, deadline=None)
@given(st.lists(member_record, max_size=12), st.sampled_from(["", "s", "sha256:" + "0" * 64]))
def test_member_set_digest_is_the_hash_of_the_sorted_encodings(records, schema):
    table = as_table(TOKEN_FORMAT, records)
    assert rr.member_set_digest(table, schema) == _reference_member_set(records, schema)
    content = pa.array([r["sampleId"] + "!" for r in records], pa.string())
    expected = _reference_member_set(records, schema, [r["sampleId"] + "!" for r in records])
    assert rr.member_set_digest(table, schema, content) == expected


def test_member_set_digest_is_pinned():
    """The digest the stored releases carry (computed by the encoding-building code this
    replaced): hashing from the buffers must not change it."""
    records = [
        {"sampleId": s, "sourceId": "forum", "sourceVersion": "v1", "logicalContentDigest": d,
         "split": sp, "tokens": 0, "ids": [], "domain": ""}
        for s, d, sp in (("s/2", "x", "train"), ("s/10", "y", "test"), ("s/2", "x", "train"),
                         ("\u00e9", "", "val"), ("s/1", "z", "train"))
    ]  # fmt: skip
    table = as_table(TOKEN_FORMAT, records)
    assert rr.member_set_digest(table, "sha256:" + "0" * 64) == PINNED_MEMBER_SET


def test_stream_is_stable_across_releases():
    """A pinned vector: changing the stream definition must be a new stream name."""
    records = [
        {
            "sampleId": "s/1",
            "sourceId": "forum",
            "sourceVersion": "v1",
            "logicalContentDigest": "ignored",
            "split": "train",
            "lang": "en",
            "text": "hello  world",
            "tokens": 2,
        },
        {
            "sampleId": "s/2",
            "sourceId": "tickets",
            "sourceVersion": "3",
            "logicalContentDigest": "ignored",
            "split": "test",
            "lang": "de",
            "text": "",
            "tokens": 0,
        },
    ]
    assert rr.STREAM_NAME == "relgate.shard.records.v2"
    assert TEXT_FORMAT.digest == PINNED_TEXT_SHARD_SCHEMA
    assert TEXT_FORMAT.logical_digest(as_table(TEXT_FORMAT, records)) == PINNED_STREAM_DIGEST


def test_token_count_is_whitespace_runs():
    table = pa.table({"text": ["a  b", " lead", "", "x\ty\nz ", "  "]})
    counts = TEXT_FORMAT.token_counts(table, None)
    assert counts.to_pylist() == [2, 1, 0, 3, 0]


def test_token_ids_count_exactly_and_binary_counts_none():
    ids = pa.table({"ids": pa.array([[1, 2, 3], [], [7]], pa.list_(pa.uint32()))})
    assert TOKEN_FORMAT.token_counts(ids, None).to_pylist() == [3, 0, 1]
    images = pa.table({"image": [b"x", b""]})
    assert BINARY_FORMAT.token_counts(images, None).to_pylist() == [0, 0]


PINNED_TEXT_SHARD_SCHEMA = "sha256:481a9378defb8641abde9a9405e42e6b7142756a985dfe3735b810853e254d82"
PINNED_STREAM_DIGEST = "sha256:dea5d38fdc03996ee946e29be9f54a3e042946e4874ddd4e2d14ec4239dc6ad5"
PINNED_MEMBER_SET = "sha256:f6e835cca26e74c31b60f6eb3440be53c4451e02f5022b98abfaf98a0d17afed"
