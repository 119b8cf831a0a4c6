"""The Arrow planner against the old per-object reasoning, on small randomized worlds.

The reference below is the collector's reasoning as it was before the tables: Python
sets of (canonical key, version) strings, one stored object at a time.  Both must give
the same candidates (same order, sizes, first-seen stamps and reasons), the same
exclusion counts, and refuse on the same missing object.
"""

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from relgate.lifecycle.inventory import (
    Exclusions,
    candidate_table,
    canonical_column,
    classify,
    excluded_counts,
    first_absent,
    listing_batches,
    owners_table,
    pairs_table,
    seen_pairs,
    stored_table,
)
from relgate.objects.layout import canonical_key
from relgate.objects.versioned import ObjectVersion

HEX = ["a" * 64, "b" * 64, "c" * 64]
NOW = "2026-01-01T00:00:10.000000Z"
STAMPS = ["2026-01-01T00:00:00.000000Z", "2026-01-01T00:00:05.000000Z", NOW]
CUTOFF = STAMPS[1]


def _spellings(hexd: str) -> list[str]:
    return [
        f"shards/sha256/{hexd}.parquet",
        f"shards//sha256/./{hexd.upper()}.parquet",
        f"cas/sha256/{hexd}",
        f"manifests/releases/{hexd}.dsse.json",
        f"manifests/snapshots/{hexd}.dsse.json",
        f"cas/sha256/{hexd}%2E",
    ]


KEYS = [k for h in HEX for k in _spellings(h)]
VERSIONS = ["v1", "v2", "v3"]
key_st = st.sampled_from(KEYS)
pair_st = st.tuples(key_st.map(canonical_key), st.sampled_from(VERSIONS))


def _reference(stored, required, protected, leased, seen, owners):
    """The old ``_Exclusions.reason`` + ``_candidates`` loop, verbatim in spirit."""
    required_keys = {k for k, _ in required}
    protected_keys = {k for k, _ in protected}
    excluded = defaultdict(int)
    candidates = []
    for key, version, size in stored:
        ck = canonical_key(key)
        why = None
        if ck != key and ck in required_keys:
            why = "other-spelling-of-required-key"
        elif (ck, version) in required:
            why = "required"
        elif (ck, version) in protected or (ck in protected_keys and ck != key):
            why = "unknown-publication-outcome"
        elif ck in leased:
            why = "publisher-lease"
        first = seen.get((key, version), NOW)
        if why is None and first > CUTOFF:
            why = "younger-than-grace"
        if why is not None:
            excluded[why] += 1
            continue
        owner = owners.get(ck)
        reason = (
            f"referenced only by versions no longer retained, e.g. {owner}"
            if owner
            else "referenced by no catalog version (orphan)"
        )
        candidates.append(
            {"key": key, "version_id": version, "size": size, "first_seen": first, "reason": reason}
        )
    return candidates, dict(excluded)


world_st = st.fixed_dictionaries(
    {
        "stored": st.lists(st.tuples(key_st, st.sampled_from(VERSIONS)), unique=True, max_size=25),
        "required": st.sets(pair_st, max_size=8),
        "protected": st.sets(pair_st, max_size=4),
        "leased": st.sets(key_st.map(canonical_key), max_size=3),
        "seen": st.dictionaries(
            st.tuples(key_st, st.sampled_from(VERSIONS)), st.sampled_from(STAMPS), max_size=10
        ),
        "owners": st.dictionaries(key_st.map(canonical_key), st.sampled_from(["v-a", "v-b"])),
        "batch": st.integers(1, 7),
    }
)


def _seen_table(seen):
    import pyarrow as pa

    keys = [k for k, _ in seen]
    versions = [v for _, v in seen]
    table = pa.table(
        {
            "key": pa.array(keys, pa.large_string()),
            "version_id": pa.array(versions, pa.large_string()),
            "first_seen": pa.array(list(seen.values()), pa.large_string()),
        }
    )
    return seen_pairs(table)


@settings(max_examples=150, deadline=None)
@given(world_st)
def test_planner_tables_match_the_per_object_reasoning(world):
    stored = [(k, v, 100 + i) for i, (k, v) in enumerate(world["stored"])]
    listed = [ObjectVersion(k, v, size) for k, v, size in stored]
    table = stored_table(listing_batches(listed, batch_rows=world["batch"]))
    exclusions = Exclusions(
        pairs_table(world["required"]),
        pairs_table(world["protected"]),
        sorted({k for k, _ in world["protected"]}),
        sorted(world["leased"]),
    )
    classified = classify(table, exclusions, _seen_table(world["seen"]), NOW, CUTOFF)
    got = candidate_table(classified, owners_table(world["owners"])).to_pylist()
    want, excluded = _reference(
        stored, world["required"], world["protected"], world["leased"], world["seen"],
        world["owners"],
    )  # fmt: skip
    assert got == want
    assert excluded_counts(classified) == excluded


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(key_st, st.sampled_from(VERSIONS)), unique=True, max_size=12),
    st.lists(pair_st, max_size=12),
)
def test_first_missing_object_is_the_one_the_old_loop_refused(stored, wanted):
    import pyarrow as pa

    index = {(canonical_key(k), v) for k, v in stored}
    expected = next((i for i, pair in enumerate(wanted) if pair not in index), None)
    table = stored_table(listing_batches(ObjectVersion(k, v, 1) for k, v in stored))
    frame = pa.table(
        {
            "order": pa.array(range(len(wanted)), pa.int64()),
            "canonical": pa.array([k for k, _ in wanted], pa.large_string()),
            "version_id": pa.array([v for _, v in wanted], pa.large_string()),
        }
    )
    assert first_absent(frame, table) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(key_st, st.text(max_size=30)), max_size=20))
def test_canonical_column_is_canonical_key(keys):
    import pyarrow as pa

    column = canonical_column(pa.chunked_array([pa.array(keys, pa.large_string())]))
    assert column.to_pylist() == [canonical_key(k) for k in keys]


def test_envelope_subject_column():
    from relgate.objects.layout import envelope_subject

    listed = [ObjectVersion(k, "v1", 1) for k in KEYS]
    table = stored_table(listing_batches(listed))
    for canon, subject in zip(
        table["canonical"].to_pylist(), table["subject"].to_pylist(), strict=True
    ):
        found = envelope_subject(canon)
        assert subject == (found[1] if found else None)
