"""The typed snapshot contracts: JSON round trips and byte equality with the old encoders.

Each ``_old_*`` function below is the hand-built dict the code produced before the models
existed (kept here, verbatim in shape, as the reference): the model's canonical bytes must
equal the canonical bytes of that dict, so stored manifests, pins and reports keep their
digests.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter
from support import corpora

from relgate.documents import snapshot_manifest as mf
from relgate.documents.policy import SelectionPolicy, SplitPolicy
from relgate.documents.source_pins import (
    CdcPin,
    IcebergPin,
    MetadataFile,
    ObjectList,
    ObjectPrefixPin,
    PinList,
    SourceEntry,
    SourcePin,
)
from relgate.documents.transform_spec import BuiltinTransform
from relgate.errors import RejectedError, UsageError
from relgate.integrity.canonical import canonical_bytes
from relgate.snapshot.comparator import Comparator, ReplayHashes
from relgate.snapshot.diff import CountDelta, DiffExamples, OldNew, SnapshotDiff
from relgate.snapshot.replay import Canary, ReplayReport
from relgate.snapshot.validate import ValidationFacts, ValidationReport

names = st.text(alphabet="abcdefghij-/:", min_size=1, max_size=8)
counts = st.integers(min_value=0, max_value=2**40)
digests = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64).map(
    lambda h: "sha256:" + h
)


# -- the old encoders (reference) ------------------------------------------------------------
def _old_selection(languages, min_chars, max_chars):
    return {
        "kind": "relgate.selection.v1",
        "languages": sorted(languages),
        "minChars": min_chars,
        "maxChars": max_chars,
    }


def _old_split(seed, buckets):
    return {"kind": "relgate.split.v1", "seed": seed, "buckets": [[n, bp] for n, bp in buckets]}


# -- strategies ------------------------------------------------------------------------------
selections = st.builds(
    lambda langs, lo, hi: (SelectionPolicy(languages=langs, min_chars=lo, max_chars=hi), langs),
    st.lists(names, max_size=4).map(tuple),
    counts,
    counts,
)


@st.composite
def splits(draw):
    n = draw(st.integers(min_value=1, max_value=4))
    split_names = draw(st.lists(names, min_size=n, max_size=n, unique=True))
    cuts = sorted(draw(st.lists(st.integers(0, 10_000), min_size=n - 1, max_size=n - 1)))
    edges = [0, *cuts, 10_000]
    buckets = tuple((name, edges[i + 1] - edges[i]) for i, name in enumerate(split_names))
    seed = draw(names)
    return SplitPolicy(seed=seed, buckets=buckets), seed, buckets


iceberg = st.builds(
    lambda i, t, s, m: IcebergPin(
        id=i,
        table=t,
        table_snapshot=f"iceberg:{s}",
        metadata_file=None if m is None else MetadataFile(location=t, digest=m, size=s),
    ),
    names,
    names,
    counts,
    st.none() | digests,
)
prefix = st.builds(
    lambda i, p, v, c, b, d: ObjectPrefixPin(
        id=i,
        prefix=p,
        objects=ObjectList(uri="cas://sha256/" + d[7:], object_version=v, count=c, bytes=b),
    ),
    names,
    names,
    names,
    counts,
    counts,
    digests,
)
cdc = st.builds(
    lambda i, s, o, w, v, c, d: CdcPin(
        id=i,
        stream=s,
        cdc_high_watermark=f"offset:{o}",
        commit_watermark=w,
        segments=PinList(uri="cas://sha256/" + d[7:], object_version=v, count=c),
    ),
    names,
    names,
    counts,
    counts,
    names,
    counts,
    digests,
)
entries = st.one_of(iceberg, prefix, cdc)


def _old_entry(pin):
    """The dict each source kind's pin() built by hand before the models."""
    if isinstance(pin, IcebergPin):
        old = {
            "id": pin.id,
            "kind": "iceberg",
            "table": pin.table,
            "tableSnapshot": pin.table_snapshot,
        }
        if pin.metadata_file is not None:  # the metadata file's digest (issue 14)
            meta = pin.metadata_file
            old["metadataFile"] = {
                "location": meta.location,
                "digest": meta.file_digest,
                "size": meta.size,
            }
        return old
    if isinstance(pin, ObjectPrefixPin):
        o = pin.objects
        return {
            "id": pin.id,
            "kind": "object-prefix",
            "prefix": pin.prefix,
            "objects": {
                "uri": o.uri,
                "objectVersion": o.object_version,
                "count": o.count,
                "bytes": o.size_bytes,
            },
        }
    s = pin.segments
    return {
        "id": pin.id,
        "kind": "cdc",
        "stream": pin.stream,
        "cdcHighWatermark": pin.cdc_high_watermark,
        "commitWatermark": pin.commit_watermark,
        "segments": {"uri": s.uri, "objectVersion": s.object_version, "count": s.count},
    }


# -- policies --------------------------------------------------------------------------------
@given(selections)
def test_selection_policy_round_trip_and_old_bytes(drawn):
    policy, langs = drawn
    assert SelectionPolicy.from_json(policy.to_json()) == policy
    old = _old_selection(langs, policy.min_chars, policy.max_chars)
    assert policy.canonical() == canonical_bytes(old)


@given(splits())
def test_split_policy_round_trip_and_old_bytes(drawn):
    policy, seed, buckets = drawn
    assert SplitPolicy.from_json(policy.to_json()) == policy
    assert policy.canonical() == canonical_bytes(_old_split(seed, buckets))


def test_policy_refusals_keep_their_checks():
    with pytest.raises(UsageError) as err:
        SplitPolicy(buckets=(("train", 1),))
    assert err.value.check == "split-sum"
    with pytest.raises(UsageError) as err:
        SplitPolicy(buckets=(("a", 5000), ("a", 5000)))
    assert err.value.check == "split-names"
    with pytest.raises(UsageError) as err:
        SelectionPolicy.from_json({"kind": "relgate.selection.v2"})
    assert err.value.check == "policy-kind"
    with pytest.raises(RejectedError) as err:  # a string where an integer is signed
        SelectionPolicy.from_json({**SelectionPolicy().to_json(), "minChars": "16"})
    assert err.value.check == "schema"


# -- source pins -----------------------------------------------------------------------------
@given(st.lists(entries, max_size=4))
def test_source_entries_round_trip_and_old_bytes(pins):
    wire = [p.to_json() for p in pins]
    assert TypeAdapter(list[SourceEntry]).validate_python(wire) == pins
    assert wire == [_old_entry(p) for p in pins]
    assert all(SourcePin(entry=p).kind == p.kind for p in pins)


def test_an_entry_of_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        TypeAdapter(list[SourceEntry]).validate_python([{"id": "x", "kind": "ftp", "path": "/"}])


# -- the manifest ----------------------------------------------------------------------------
@st.composite
def bodies(draw):
    selection, _ = draw(selections)
    split, _, _ = draw(splits())
    pins = tuple(draw(st.lists(entries, max_size=3)))
    parents = tuple(draw(st.lists(digests, max_size=2)))
    by_source = draw(st.none() | st.dictionaries(names, counts, max_size=3))
    records = draw(st.sampled_from((corpora.TEXT, corpora.TOKENS, corpora.BINARY)))
    return mf.SnapshotBody(
        parents=parents,
        sources=pins,
        tombstone_watermark=draw(counts),
        benchmark_fence=draw(counts),
        record_schema=records.digest(),
        record_schema_document=records,
        selection_policy=selection.digest(),
        transform_image="registry.local/normalize@" + draw(digests),
        transform=BuiltinTransform(name="normalize", code_digest=draw(digests)),
        members=mf.MembersRef(
            uri="cas://sha256/" + draw(digests)[7:],
            object_version=draw(names),
            size=draw(counts),
            count=draw(counts),
            tuple_root=draw(digests),
            media_type=mf.MEMBERS_MEDIA_TYPE,
        ),
        split_policy=split.digest(),
        purpose=draw(names),
        splits=draw(st.dictionaries(names, counts, max_size=3)),
        member_counts_by_source=by_source,
        policies=mf.EmbeddedPolicies(selection=selection, split=split),
        provenance=mf.Provenance(
            was_derived_from=tuple(mf.Derivation(entity=p.digest(), kind=p.kind) for p in pins),
            was_generated_by=mf.Generation(
                activity="relgate.snapshot.build",
                build_id=draw(names),
                transform="t",
                started_at_time="2026-01-01T00:00:00Z",
                ended_at_time="2026-01-01T00:00:01Z",
            ),
            was_associated_with=mf.Association(agent=draw(names), builder="relgate x", keyid="k"),
        ),
    )


def _old_body(body):
    """The dict the builder assembled by hand before the models (same keys, same nesting)."""
    out = {
        "schema": mf.SCHEMA,
        "parents": list(body.parents),
        "sources": [_old_entry(p) for p in body.sources],
        "tombstoneWatermark": body.tombstone_watermark,
        "benchmarkFence": body.benchmark_fence,
        "recordSchema": body.record_schema,
        "recordSchemaDocument": body.record_schema_document.to_json(),
        "selectionPolicy": body.selection_policy,
        "transformImage": body.transform_image,
        "transform": {
            "kind": "builtin-source",
            "name": body.transform.name,
            "codeDigest": body.transform.code_digest,
        },
        "members": {
            "uri": body.members.uri,
            "objectVersion": body.members.object_version,
            "size": body.members.size,
            "count": body.members.count,
            "tupleRoot": body.members.tuple_root,
            "mediaType": "application/vnd.apache.parquet",
        },
        "splitPolicy": body.split_policy,
        "purpose": body.purpose,
        "splits": dict(body.splits),
        "policies": {
            "selection": body.policies.selection.to_json(),
            "split": body.policies.split.to_json(),
        },
        "provenance": {
            "wasDerivedFrom": [
                {"entity": d.entity, "kind": d.kind} for d in body.provenance.was_derived_from
            ],
            "wasGeneratedBy": {
                "activity": "relgate.snapshot.build",
                "buildId": body.provenance.was_generated_by.build_id,
                "transform": "t",
                "startedAtTime": "2026-01-01T00:00:00Z",
                "endedAtTime": "2026-01-01T00:00:01Z",
            },
            "wasAssociatedWith": {
                "agent": body.provenance.was_associated_with.agent,
                "builder": "relgate x",
                "keyid": "k",
            },
        },
    }
    if body.member_counts_by_source is not None:  # older manifests have no such field
        out["memberCountsBySource"] = dict(body.member_counts_by_source)
    return out


@settings(max_examples=60)
@given(bodies())
def test_manifest_round_trip_and_old_digest(body):
    old = _old_body(body)
    assert body.canonical() == canonical_bytes(old)
    sealed = mf.seal(body)
    assert sealed.digest == mf.KIND.seal(old)["snapshotId"]
    assert mf.seal(old) == sealed
    assert mf.SnapshotManifest.parse(sealed.to_json()) == sealed
    assert mf.from_payload(sealed.body) == sealed
    assert ("memberCountsBySource" in sealed.body) == (body.member_counts_by_source is not None)


@settings(max_examples=20)
@given(bodies())
def test_a_payload_the_model_would_respell_is_refused(body):
    """Absent and null are different bytes: a signed null where the field is optional is
    not silently dropped, and an unknown field is not carried along."""
    sealed = mf.seal(body).body
    with pytest.raises(RejectedError) as err:
        mf.from_payload({**sealed, "memberCountsBySource": None})
    assert err.value.check == "schema"
    with pytest.raises(RejectedError) as err:
        mf.from_payload({**sealed, "extra": 1})
    assert err.value.check == "schema"


@settings(max_examples=10)
@given(bodies())
def test_a_manifest_without_its_transform_pin_is_refused(body):
    """Every manifest carries its typed transform pin; one without it (the shape before
    pinned transforms) is not looked up again by digest but refused by the model."""
    sealed = mf.KIND.seal({k: v for k, v in body.to_json().items() if k != "transform"})
    with pytest.raises(RejectedError) as err:
        mf.from_payload(sealed)
    assert err.value.check == "schema"


# -- reports and results ---------------------------------------------------------------------
@given(
    st.dictionaries(names, counts, max_size=5),
    st.lists(names, max_size=3),
    st.sampled_from(["VALIDATED", "REJECTED", "INCOMPLETE"]),
    st.none() | counts,
    st.none() | digests,
)
def test_validation_report_round_trip_and_old_bytes(checks, problems, outcome, members, root):
    facts = {k: v for k, v in (("members", members), ("tupleRoot", root)) if v is not None}
    report = ValidationReport(
        snapshot="sha256:" + "0" * 64,
        outcome=outcome,
        checks=checks,
        facts=ValidationFacts.model_validate(facts),
        problems=tuple(problems),
        report_digest="sha256:" + "1" * 64,  # not part of the signed payload
    )
    old = {
        "schema": "relgate.snapshot.validation.v2",
        "coverage": [],
        "rowAccounting": [],
        "snapshot": report.snapshot,
        "outcome": outcome,
        "checks": checks,
        "facts": facts,
        "problems": problems,
    }
    assert report.canonical() == canonical_bytes(old)
    assert ValidationReport.parse(report.to_json()) == report.model_copy(
        update={"report_digest": None}
    )


@given(counts, counts, st.dictionaries(names, counts, max_size=3), st.lists(names, max_size=3))
def test_diff_and_replay_results_round_trip(a, b, migrations, added):
    delta = {"train": CountDelta(old=a, new=b, delta=b - a)}
    result = SnapshotDiff(
        old="o",
        new="n",
        counts=OldNew(old=a, new=b),
        additions=a,
        deletions=b,
        content_changes=0,
        split_migrations=migrations,
        by_source=delta,
        by_split=delta,
        examples=DiffExamples(added=tuple(added), deleted=()),
    )
    assert SnapshotDiff.parse(result.to_json()) == result
    assert set(result.to_json()) == {
        "old",
        "new",
        "counts",
        "additions",
        "deletions",
        "contentChanges",
        "splitMigrations",
        "bySource",
        "bySplit",
        "examples",
    }
    replayed = ReplayReport(
        snapshot="s",
        canary=Canary(basis_points=a),
        comparator=Comparator.of("relgate.replay.numeric", "0.5"),
        expected_ids=a,
        replayed_ids=a,
        missing=0,
        extra=0,
        mismatching_ids=0,
        examples=(),
        numeric_columns=(),
        replay_hashes=ReplayHashes(expected="h", replayed="h"),
        reference="membership",
        result="REPRODUCED",
    )
    assert ReplayReport.parse(replayed.to_json()) == replayed
    assert replayed.to_json()["comparator"] == {
        "name": "relgate.replay.numeric",
        "version": 1,
        "tolerance": "0.5",
    }
