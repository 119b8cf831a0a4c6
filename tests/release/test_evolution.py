"""Schema evolution: real releases of different record schemas, declared readers, the
signed report the verifier stores, and publication refused for a reader that cannot read.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.cli import relgate_cli as run_cli
from support.releases import overwrite_in_place
from support.snapshots import build_approved
from support.workspaces import make_workspace

from relgate.catalog import evolution_table
from relgate.documents.declared_readers import ReaderSpec
from relgate.errors import IntegrityError, RejectedError
from relgate.holds.refs import version_refs
from relgate.integrity.signing import sign_envelope
from relgate.objects.layout import cas_key
from relgate.records.record_schema import (
    FIXED_TYPES,
    VARIABLE_TYPES,
    FieldSpec,
    RecordSchema,
    TokenRule,
    arrow_type,
)
from relgate.release import evolution
from relgate.release.evolution import SCHEMA_COMPATIBILITY, classify, widens
from relgate.release.publication import approve_release, publish, rollback_release
from relgate.release.verify.verifier import verify_release
from relgate.release.writer import write_release

RELGATE = [sys.executable, "-m", "relgate"]
BASE = (
    FieldSpec(name="sampleId", type="string"),
    FieldSpec(name="lang", type="string"),
    FieldSpec(name="text", type="string"),
)


def schema(name: str, *extra: FieldSpec) -> RecordSchema:
    return RecordSchema(
        name=name,
        fields=(*BASE, *extra),
        content=("lang", "text"),
        tokens=TokenRule(kind="whitespace-runs", column="text"),
        label="lang",
    )


#: v1: a title and a 64-bit view count.
V1 = schema("evo.v1", FieldSpec(name="title", type="string"), FieldSpec(name="views", type="int64"))
#: v2: title renamed (declared) to heading, views narrowed to int32, a nullable topic added.
V2 = schema(
    "evo.v2",
    FieldSpec(name="heading", type="string", renamedFrom="title"),
    FieldSpec(name="views", type="int32"),
    FieldSpec(name="topic", type="string", nullable=True),
)
#: v3 from v2: views widened back to int64 (and nothing else).
V3 = schema(
    "evo.v3",
    FieldSpec(name="heading", type="string"),
    FieldSpec(name="views", type="int64"),
    FieldSpec(name="topic", type="string", nullable=True),
)

TRAINER = {
    "name": "trainer",
    "requires": [{"name": "sampleId", "type": "string"}, {"name": "text", "type": "string"}],
    "optional": [{"name": "lang", "type": "string"}],
}
INDEXER = {"name": "indexer", "requires": [{"name": "title", "type": "string"}]}
COUNTER = {
    "name": "counter",
    "requires": [{"name": "views", "type": "int32"}],
    "acceptsWidening": True,
}
STRICT_COUNTER = {"name": "strict-counter", "requires": [{"name": "views", "type": "int32"}]}


def _lines(n: int = 30) -> bytes:
    rows = [
        {
            "id": f"doc-{i:03d}",
            "lang": ["en", "de", "fr"][i % 3],
            "text": " ".join(["token"] * (3 + i % 7)) + f" about routers number {i}",
            "title": f"title {i}",
            "heading": f"title {i}",
            "views": 1000 + i,
            "topic": None if i % 2 else "networks",
        }
        for i in range(n)
    ]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


@pytest.fixture
def ews(tmp_path, db_url):
    ws = make_workspace(tmp_path / "home", db_url, seed=False)
    ws.store.put("raw/docs/part-0.jsonl", _lines())
    ws.config["sources"] = [{"id": "docs", "kind": "object-prefix", "prefix": "raw/docs/"}]
    ws.config["snapshot"] = {"purpose": "evo-test", "transform": "registry.local/identity:v1"}
    ws.save()
    yield ws
    ws.close()


def declare(ws, *readers):
    ws.config["readers"] = list(readers)
    ws.save()


def release_of(ws, records, parents=()):
    snap = build_approved(ws, records=records, parents=list(parents))
    root = write_release(ws, snap.digest, records_per_shard=10, actor="test").digest
    return snap.digest, root


def verified(ws, root):
    report = verify_release(ws, root, workers=0, actor="test")
    assert report.ok, report.failing
    return report


def published_and_next(ws, old, new):
    """A verified, published release of ``old``, then a verified one of ``new`` cut from
    a child snapshot; their roots."""
    snap, first = release_of(ws, old)
    verified(ws, first)
    approve_release(ws, first, approver="alice")
    publish(ws, first, alias="train", actor="alice")
    _, second = release_of(ws, new, parents=[snap])
    verified(ws, second)
    return first, second


def test_schema_diff_reports_added_removed_renamed_and_type_changes(ews):
    declare(ews, TRAINER, INDEXER, COUNTER)
    snap1, root1 = release_of(ews, V1)
    snap2, root2 = release_of(ews, V2, parents=[snap1])
    report = evolution.schema_diff(ews, root1, root2)
    body = report.to_json()
    assert body["old"]["subject"] == root1 and body["new"]["subject"] == root2
    assert body["old"]["recordSchema"] == V1.digest()
    assert body["new"]["recordSchema"] == V2.digest()
    assert [f["name"] for f in body["added"]] == ["topic"]
    assert body["removed"] == []
    assert body["renamed"] == [{"from": "title", "to": "heading"}]
    assert body["typeChanges"] == [
        {
            "column": "views",
            "oldType": "int64",
            "newType": "int32",
            "oldNullable": False,
            "newNullable": False,
            "change": "narrowing",
        }
    ]
    assert body["content"]["changed"] is False and body["tokenRule"]["changed"] is False
    verdicts = {v["reader"]: v for v in body["readers"]}
    assert verdicts["trainer"]["verdict"] == "COMPATIBLE"
    assert verdicts["indexer"]["verdict"] == "INCOMPATIBLE"
    assert "renamed to 'heading'" in verdicts["indexer"]["reasons"][0]
    # counter reads views as int32: v2's int32 is exact, so compatible
    assert verdicts["counter"]["verdict"] == "COMPATIBLE"
    assert body["counts"] == {
        "added": 1,
        "removed": 0,
        "renamed": 1,
        "typeChanged": 1,
        "widened": 0,
        "narrowed": 1,
        "incompatibleReaders": 1,
    }
    # snapshot digests are accepted too, with the same schema digests
    by_snapshot = evolution.schema_diff(ews, snap1, snap2).to_json()
    assert by_snapshot["old"]["kind"] == "snapshot"
    assert by_snapshot["new"]["shardSchema"] == body["new"]["shardSchema"]
    assert by_snapshot["typeChanges"] == body["typeChanges"]


def test_renamed_from_is_absent_when_unset_so_digests_do_not_change():
    plain = FieldSpec(name="text", type="string")
    assert "renamedFrom" not in plain.to_json()
    assert FieldSpec.parse({"name": "text", "type": "string"}).digest() == plain.digest()
    with pytest.raises(ValueError, match="still has"):
        schema("bad", FieldSpec(name="title", type="string", renamedFrom="text"))


def test_verifier_stores_a_signed_report_and_publication_refuses_an_unreadable_release(ews):
    declare(ews, TRAINER, INDEXER)
    snap1, root1 = release_of(ews, V1)
    first = verified(ews, root1)
    stored1, _ = evolution.load_stored(ews, root1)
    assert stored1.old is None  # no previous release: every reader against v1 alone
    assert {v.reader: v.verdict for v in stored1.readers} == {
        "trainer": "COMPATIBLE",
        "indexer": "COMPATIBLE",
    }
    assert first.state == "VERIFIED"
    approve_release(ews, root1, approver="alice")
    publish(ews, root1, alias="train", actor="alice")

    _, root2 = release_of(ews, V2, parents=[snap1])
    verified(ews, root2)
    stored2, digest2 = evolution.load_stored(ews, root2)
    assert stored2.old.subject == root1  # the published release of the parent snapshot
    row = evolution_table.newest(ews.db, root2)
    assert row.old_root == root1 and row.compatible == 0
    out = run_cli(ews.home, "release", "publish", root2, "--alias", "train", expect=3)
    assert out["check"] == SCHEMA_COMPATIBILITY and out["digest"] == root2
    assert out["details"]["reader"] == "indexer" and "indexer" in out["message"]
    assert root2 in out["object"]
    refused = run_cli(ews.home, "release", "approve", root2, "--approver", "bob", expect=3)
    assert refused["check"] == SCHEMA_COMPATIBILITY
    diff = run_cli(ews.home, "release", "schema-diff", root1, root2, expect=0)
    assert diff["renamed"] == [{"from": "title", "to": "heading"}]
    human = subprocess.run(
        [*RELGATE, "--home", str(ews.home), "release", "schema-diff", root1, root2],
        capture_output=True,
        text=True,
        check=False,
    )
    assert human.returncode == 0, human.stderr
    assert "~ title -> heading (renamed)" in human.stdout
    assert "~ views: int64 -> int32 (narrowing)" in human.stdout
    assert "indexer: INCOMPATIBLE" in human.stdout
    # garbage collection keeps the signed report as long as the root
    with ews.db.tx() as conn:
        refs = version_refs(ews, conn, "release", root2)
    assert (cas_key(digest2), row.report_version) in {(r.key, r.version_id) for r in refs}


def test_a_compatible_change_publishes_and_a_strict_reader_is_refused(ews):
    declare(ews, TRAINER, COUNTER)
    root2, root3 = published_and_next(ews, V2, V3)
    stored, _ = evolution.load_stored(ews, root3)
    assert [c.change for c in stored.type_changes] == ["widening"]
    approve_release(ews, root3, approver="alice")
    change = publish(ews, root3, alias="train", actor="alice")
    assert change.generation == 2
    # `alias show` shows a release alias as it stands (it refused with exit 2 before)
    shown = run_cli(ews.home, "alias", "show", "train", expect=0)
    assert (shown["kind"], shown["activeDigest"], shown["generation"]) == ("release", root3, 2)
    assert [h["digest"] for h in shown["history"]][-1] == root3

    # a reader declared after verification is not covered: fail closed until re-verified
    declare(ews, TRAINER, COUNTER, STRICT_COUNTER)
    with pytest.raises(RejectedError) as err:
        evolution.require_readable(ews, root3)
    assert err.value.check == SCHEMA_COMPATIBILITY
    assert err.value.details["reader"] == "strict-counter"
    verified(ews, root3)  # re-verification stores a report that covers it: widened, refused
    with pytest.raises(RejectedError) as err:
        evolution.require_readable(ews, root3)
    assert "does not accept widened types" in err.value.message
    # a rollback is a publication too: root2's report does not cover the new reader
    with pytest.raises(RejectedError) as err:
        rollback_release(ews, "train", root2, actor="alice")
    assert err.value.check == SCHEMA_COMPATIBILITY and err.value.digest == root2


def test_no_report_is_refused_when_readers_are_declared(ews):
    _, root = release_of(ews, V1)
    verified(ews, root)  # verified before any reader was declared: a report with no readers
    with ews.db.tx() as conn:
        conn.exec_driver_sql("DELETE FROM schema_evolution_reports")
    approve_release(ews, root, approver="alice")  # no readers declared: nothing to check
    declare(ews, TRAINER)
    out = run_cli(ews.home, "release", "publish", root, "--alias", "train", expect=3)
    assert out["check"] == SCHEMA_COMPATIBILITY and out["digest"] == root
    assert "no schema-evolution report" in out["message"]


def test_a_tampered_or_forged_stored_report_is_refused(ews):
    declare(ews, TRAINER, INDEXER)
    root1, root2 = published_and_next(ews, V1, V2)
    stored, digest = evolution.load_stored(ews, root2)
    row = evolution_table.newest(ews.db, root2)

    # a forged report claiming every reader is fine, signed by the builder (not the verifier)
    lenient = stored.model_copy(
        update={
            "readers": tuple(
                v.model_copy(update={"verdict": "COMPATIBLE", "reasons": ()})
                for v in stored.readers
            )
        }
    )
    envelope = sign_envelope(evolution.PAYLOAD_TYPE, lenient.canonical(), ews.key("builder"))
    ref = ews.cas.put(json.dumps(envelope, sort_keys=True).encode())
    evolution_table.record(
        ews.db, root=root2, old_root=root1, ref=ref, compatible=True, actor="forger"
    )
    out = run_cli(ews.home, "release", "publish", root2, "--alias", "train", expect=3)
    assert out["check"] == SCHEMA_COMPATIBILITY and out["digest"] == root2
    assert out["details"]["report"] == ref.digest

    # the verifier's own report, its stored bytes rewritten in place
    evolution_table.record(
        ews.db,
        root=root2,
        old_root=root1,
        ref=type(ref)(digest, row.report_version, 0),
        compatible=False,
        actor="verifier",
    )
    path = ews.store.local_path(cas_key(digest), row.report_version)
    tampered = json.loads(path.read_bytes())
    tampered["payload"] = base64.b64encode(lenient.canonical()).decode()
    overwrite_in_place(path, json.dumps(tampered, sort_keys=True).encode())
    with pytest.raises(IntegrityError) as err:
        publish(ews, root2, alias="train", actor="alice")
    assert err.value.check == SCHEMA_COMPATIBILITY and err.value.digest == root2


def test_readers_config_is_validated(ews):
    ews.config["readers"] = [{"name": "x", "requires": [{"name": "a", "type": "utf8"}]}]
    with pytest.raises(RejectedError):
        ews.save()
    ews.config["readers"] = [INDEXER, INDEXER]
    with pytest.raises(RejectedError):
        ews.save()


# -- the widening order --------------------------------------------------------------------
PRIMITIVES = sorted(set(FIXED_TYPES) | set(VARIABLE_TYPES))
LIST_ITEMS = sorted(t for t in FIXED_TYPES if t != "bool")
type_names = st.one_of(
    st.sampled_from(PRIMITIVES),
    st.builds(
        lambda outer, item: f"{outer}<{item}>",
        st.sampled_from(["list", "large_list"]),
        st.sampled_from(LIST_ITEMS),
    ),
)


@given(type_names)
def test_widening_is_reflexive(name):
    assert widens(name, name)


@given(type_names, type_names, type_names)
def test_widening_is_transitive(a, b, c):
    if widens(a, b) and widens(b, c):
        assert widens(a, c)


@given(type_names, type_names)
def test_widening_is_antisymmetric_and_classification_agrees(a, b):
    if a != b and widens(a, b):
        assert not widens(b, a)
    old, new = FieldSpec(name="c", type=a), FieldSpec(name="c", type=b, nullable=True)
    expected = "widening" if widens(a, b) else "changed"
    assert classify(old, new) == expected
    assert classify(new, old) == ("narrowing" if widens(a, b) else "changed")


@given(type_names, type_names)
def test_every_widening_casts_values_losslessly(a, b):
    """Independent of the rule table: Arrow's safe cast keeps every value of ``a`` in ``b``
    and back, for the extreme values of ``a``."""
    if not widens(a, b):
        return
    source = arrow_type(a)
    base = (
        source.value_type if pa.types.is_list(source) or pa.types.is_large_list(source) else source
    )
    if pa.types.is_integer(base):
        info = (base.bit_width, pa.types.is_signed_integer(base))
        lo = -(1 << (info[0] - 1)) if info[1] else 0
        hi = (1 << (info[0] - 1)) - 1 if info[1] else (1 << info[0]) - 1
        values = [lo, hi, 0]
    elif pa.types.is_floating(base):
        values = [1.5, -2.25, 3.4e38 if base.bit_width == 32 else 1e300]
    elif pa.types.is_boolean(base):
        values = [True, False]
    elif pa.types.is_binary(base) or pa.types.is_large_binary(base):
        values = [b"\x00\xff", b""]
    else:
        values = ["é", ""]
    data = pa.array([values] if base is not source else values, source)
    widened = pc.cast(data, arrow_type(b), safe=True)
    assert pc.cast(widened, source, safe=True).equals(data)


def test_reader_spec_round_trips():
    spec = ReaderSpec.parse(COUNTER)
    assert spec.accepts_widening and spec.to_json()["acceptsWidening"] is True
