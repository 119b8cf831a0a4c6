"""The collector's tables: the stored listing, the required set and the candidates as
Arrow columns, and every exclusion computed as a join over ``(key, versionId)``.

The listing is streamed from the store into Arrow record batches (one Python tuple per
stored version only while its batch fills), canonical keys are computed column-wise (the
rare key that is not already canonical goes through :func:`canonical_key`), and the
reasons a stored version is not a candidate are evaluated in the order the collector
documents: another spelling of a required key, required, named (a registered transform
or tokenizer, a tag, the workspace config), kept for audit (a collected version's signed
manifest, membership table and reports), unknown publication outcome, publisher lease,
younger than the grace period.

Arrow compute (not polars) on purpose: its thread pool survives ``fork``, and sweeps run
in forked workers (the pin/sweep race test, Dagster's multiprocess executor).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import Connection

from relgate.objects.layout import (
    ENVELOPE_SUFFIX,
    RELEASE_MANIFEST_PREFIX,
    SNAPSHOT_MANIFEST_PREFIX,
    canonical_key,
)
from relgate.objects.versioned import ObjectVersion

#: Rows per Arrow record batch while the listing streams in.
LISTING_BATCH = 65_536
#: Keys the column-wise fast path passes through unchanged: a subset of the keys
#: :func:`canonical_key` returns as they are (lower-case ASCII, no scheme, no escapes,
#: no empty or dot segments), so both paths give the same canonical key.
_PLAIN_KEY = r"^[0-9a-z_\-][0-9a-z_.\-/]*$"
_LISTING_SCHEMA = pa.schema(
    [("key", pa.large_string()), ("version_id", pa.large_string()), ("size", pa.int64())]
)
_SEEN_SCHEMA = pa.schema(
    [
        ("key", pa.large_string()),
        ("version_id", pa.large_string()),
        ("first_seen", pa.large_string()),
    ]
)
PAIR_SCHEMA = pa.schema([("canonical", pa.large_string()), ("version_id", pa.large_string())])
_PAIR = ["canonical", "version_id"]
ORPHAN = "referenced by no catalog version (orphan)"
FORMER = "referenced only by versions no longer retained, e.g. "


def _text(value: str) -> pa.Scalar:
    return pa.scalar(value, pa.large_string())


def pair_key(
    first: pa.ChunkedArray | pa.Array, second: pa.ChunkedArray | pa.Array
) -> pa.ChunkedArray:
    """One unambiguous column for a pair of string columns: ``len(first):first:second``
    (the byte length in front makes the split point unique whatever the strings hold)."""
    length = pc.cast(pc.binary_length(first), pa.large_string())
    return pc.binary_join_element_wise(length, first, second, _text(":"))


def _batch(keys: list[str], versions: list[str], sizes: list[int]) -> pa.RecordBatch:
    columns = [
        pa.array(keys, pa.large_string()),
        pa.array(versions, pa.large_string()),
        pa.array(sizes, pa.int64()),
    ]
    return pa.record_batch(columns, schema=_LISTING_SCHEMA)


def listing_batches(
    listed: Iterable[ObjectVersion], batch_rows: int = LISTING_BATCH
) -> Iterator[pa.RecordBatch]:
    """The stored versions as record batches of (key, version_id, size), listing order."""
    keys: list[str] = []
    versions: list[str] = []
    sizes: list[int] = []
    for obj in listed:
        keys.append(obj.key)
        versions.append(obj.version_id)
        sizes.append(obj.size)
        if len(keys) >= batch_rows:
            yield _batch(keys, versions, sizes)
            keys, versions, sizes = [], [], []
    if keys:
        yield _batch(keys, versions, sizes)


def canonical_column(keys: pa.ChunkedArray) -> pa.ChunkedArray:
    """:func:`canonical_key` of every key, column-wise for the keys already canonical."""
    plain = pc.and_(
        pc.match_substring_regex(keys, _PLAIN_KEY),
        pc.invert(
            pc.or_(
                pc.or_(pc.match_substring(keys, "//"), pc.match_substring(keys, "/.")),
                pc.ends_with(keys, "/"),
            )
        ),
    )
    odd = pc.invert(plain)
    if not pc.any(odd).as_py():
        return keys
    fixed = [canonical_key(str(k)) for k in pc.filter(keys, odd).to_pylist()]
    replaced = pc.replace_with_mask(
        keys.combine_chunks(), odd.combine_chunks(), pa.array(fixed, pa.large_string())
    )
    return pa.chunked_array([replaced])


def _subject(canonical: pa.ChunkedArray) -> pa.ChunkedArray:
    """``relgate.objects.layout.envelope_subject`` of each canonical key, as a digest."""
    out = pa.nulls(len(canonical), pa.large_string())
    envelopes = pc.ends_with(canonical, ENVELOPE_SUFFIX).combine_chunks()
    if not pc.any(envelopes).as_py():
        return pa.chunked_array([out])
    keys = pc.filter(canonical, envelopes)  # the few envelope-like keys, not every one
    found = pa.nulls(len(keys), pa.large_string())
    for prefix in (RELEASE_MANIFEST_PREFIX, SNAPSHOT_MANIFEST_PREFIX):
        middle = pc.utf8_slice_codeunits(keys, len(prefix), -len(ENVELOPE_SUFFIX))
        digest = pc.binary_join_element_wise(_text("sha256:"), middle, _text(""))
        found = pc.if_else(pc.starts_with(keys, prefix), digest, found)
    return pa.chunked_array([pc.replace_with_mask(out, envelopes, found.combine_chunks())])


def stored_table(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    """The listing as one table: key, version_id, size, canonical, subject, row, and the
    :func:`pair_key` of (key, version_id) as listed and of (canonical, version_id), each
    computed once (the same column when every key is canonical already)."""
    table = pa.Table.from_batches(list(batches), schema=_LISTING_SCHEMA)
    canonical = canonical_column(table["key"])
    listed = pair_key(table["key"], table["version_id"])
    pair = listed if canonical is table["key"] else pair_key(canonical, table["version_id"])
    table = table.append_column("canonical", canonical).append_column(
        "subject", _subject(canonical)
    )
    table = table.append_column("row", pa.array(range(table.num_rows), pa.int64()))
    return table.append_column("listed_pair", listed).append_column("pair", pair)


def pairs_table(pairs: Iterable[tuple[str, str]]) -> pa.Table:
    """(canonical, version_id) pairs as a table without duplicates."""
    keys: list[str] = []
    versions: list[str] = []
    for key, version in pairs:
        keys.append(key)
        versions.append(version)
    table = pa.table([pa.array(keys, pa.large_string()), pa.array(versions, pa.large_string())],
                     schema=PAIR_SCHEMA)  # fmt: skip
    return table.group_by(_PAIR, use_threads=False).aggregate([])


def first_absent(wanted: pa.Table, stored: pa.Table) -> int | None:
    """The smallest ``order`` of a wanted (canonical, version_id) the listing lacks."""
    if wanted.num_rows == 0:
        return None
    wanted_pairs = pair_key(wanted["canonical"], wanted["version_id"])
    # The hash table over the wanted pairs (thousands), not over the listing (millions):
    # which listed pairs are wanted, then which wanted pairs were among them.
    listed = pc.filter(stored["pair"], pc.is_in(stored["pair"], value_set=wanted_pairs))
    present = pc.is_in(wanted_pairs, value_set=listed)
    absent = pc.filter(wanted["order"], pc.invert(present))
    return None if len(absent) == 0 else int(pc.min(absent).as_py())


def seen_table(conn: Connection, batch_rows: int = LISTING_BATCH) -> pa.Table:
    """``gc_seen`` as a table (key, version_id, first_seen, pair: the :func:`pair_key` of
    key and version_id), fetched in batches straight from the driver's cursor (no row
    objects)."""
    cursor = conn.connection.cursor()
    try:
        cursor.execute("SELECT object_key, version_id, first_seen FROM gc_seen")
        batches = []
        while chunk := cursor.fetchmany(batch_rows):
            columns = [pa.array(column, pa.large_string()) for column in zip(*chunk, strict=True)]
            batches.append(pa.record_batch(columns, schema=_SEEN_SCHEMA))
    finally:
        cursor.close()
    return seen_pairs(pa.Table.from_batches(batches, schema=_SEEN_SCHEMA))


def seen_pairs(seen: pa.Table) -> pa.Table:
    """A (key, version_id, first_seen) table with its ``pair`` column, computed once."""
    return seen.append_column("pair", pair_key(seen["key"], seen["version_id"]))


def seen_index(stored: pa.Table, seen: pa.Table) -> pa.ChunkedArray:
    """Per stored version (listing order, as listed): its row in ``seen``, null when
    ``gc_seen`` has none (one hash table over ``seen``, shared by :func:`unseen` and
    :func:`classify`)."""
    return pc.index_in(stored["listed_pair"], value_set=seen["pair"])


def unseen(stored: pa.Table, at: pa.ChunkedArray) -> pa.Table:
    """(key, version_id) of the stored versions ``gc_seen`` has no row for (``at`` from
    :func:`seen_index`)."""
    return stored.select(["key", "version_id"]).filter(pc.is_null(at))


@dataclass(frozen=True)
class Exclusions:
    """What keeps stored versions from being candidates: pair tables and key columns."""

    required: pa.Table  # canonical, version_id
    protected: pa.Table  # canonical, version_id
    protected_keys: Sequence[str]
    leased: Sequence[str]
    #: keys a name points at (:mod:`relgate.lifecycle.names`): kept whole
    named: Sequence[str] = ()
    #: (canonical, version_id) of collected versions' audit documents still kept
    audit: pa.Table = field(default_factory=lambda: pairs_table(()))


def _flag(stored: pa.Table, pairs: pa.Table) -> pa.ChunkedArray:
    """Is each stored (canonical, version_id) in ``pairs``."""
    wanted = pair_key(pairs["canonical"], pairs["version_id"])
    return pc.is_in(stored["pair"], value_set=wanted)


def _is_in(column: pa.ChunkedArray, values: Iterable[str]) -> pa.ChunkedArray:
    return pc.is_in(column, value_set=pa.array(list(values), pa.large_string()))


def classify(
    stored: pa.Table,
    exclusions: Exclusions,
    seen: pa.Table,
    now: str,
    cutoff: str,
    at: pa.ChunkedArray | None = None,
) -> pa.Table:
    """Every stored version (listing order, as listed) with ``first_seen`` (``now`` if never seen)
    and ``why_not``: the first exclusion reason that applies, or null for a candidate.
    ``at``: :func:`seen_index` of ``stored`` in ``seen`` when the caller has it already."""
    table = stored
    if at is None:
        at = seen_index(stored, seen)
    first_seen = pc.fill_null(pc.take(seen["first_seen"], at), _text(now))
    canon = table["canonical"]
    respelled = pc.not_equal(canon, table["key"])
    required_keys = pc.unique(exclusions.required["canonical"])
    reasons = [
        (pc.and_(respelled, pc.is_in(canon, value_set=required_keys)), "other-spelling-of-required-key"),
        (_flag(stored, exclusions.required), "required"),
        (_is_in(canon, exclusions.named), "named"),
        (_flag(stored, exclusions.audit), "audit-trail"),
        (
            pc.or_(_flag(stored, exclusions.protected), pc.and_(_is_in(canon, exclusions.protected_keys), respelled)),
            "unknown-publication-outcome",
        ),
        (_is_in(canon, exclusions.leased), "publisher-lease"),
        (pc.greater(first_seen, _text(cutoff)), "younger-than-grace"),
    ]  # fmt: skip
    why = pa.nulls(table.num_rows, pa.large_string())
    for condition, reason in reversed(reasons):
        why = pc.if_else(condition, _text(reason), why)
    return table.append_column("first_seen", first_seen).append_column("why_not", why)


def excluded_counts(classified: pa.Table) -> dict[str, int]:
    """Reason -> how many stored versions it excluded."""
    counts = pc.value_counts(classified["why_not"])
    return {
        str(entry["values"]): int(entry["counts"])
        for entry in counts.to_pylist()
        if entry["values"] is not None
    }


def candidate_table(classified: pa.Table, owners: pa.Table) -> pa.Table:
    """The candidates in listing order: key, version_id, size, first_seen, reason."""
    chosen = classified.filter(pc.is_null(classified["why_not"]))
    owner = pc.take(
        owners["owner"], pc.index_in(chosen["canonical"], value_set=owners["canonical"])
    )
    former = pc.binary_join_element_wise(_text(FORMER), owner, _text(""))
    reason = pc.if_else(pc.is_null(owner), _text(ORPHAN), former)
    return chosen.select(["key", "version_id", "size", "first_seen"]).append_column(
        "reason", reason
    )


def owners_table(owners: dict[str, str]) -> pa.Table:
    return pa.table(
        {
            "canonical": pa.array(list(owners), pa.large_string()),
            "owner": pa.array(list(owners.values()), pa.large_string()),
        }
    )
