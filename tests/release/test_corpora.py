"""Token-id and binary corpora end to end: built, validated, released and verified, with
their record schemas declared in the manifest and the root, exact token counts, and the
faults that belong to typed records refused naming the row."""

import base64
import json

import pyarrow as pa
import pytest
from support import record_reference as ref
from support.releases import forge, read_shard, write
from support.snapshots import build, build_approved
from support.workspaces import make_workspace

from relgate.demo.image_corpus import IMAGE_RECORDS, PREFIX, seed_images
from relgate.demo.token_corpus import TOKEN_RECORDS, seed_tokens
from relgate.documents import release_root as rm
from relgate.documents import shard_format as rr
from relgate.documents import snapshot_manifest as mf
from relgate.errors import IntegrityError, RejectedError
from relgate.holds.refs import version_refs
from relgate.records.record_schema import RecordSchema
from relgate.release.verify.verifier import verify_release
from relgate.sources.iceberg import open_catalog


@pytest.fixture
def blank(tmp_path, db_url):
    workspace = make_workspace(tmp_path / "home", db_url, seed=False)
    yield workspace
    workspace.close()


def _members_of_release(ws, release):
    return pa.concat_tables([read_shard(ws, d) for d in rm.wire_shards(release.document())])


def test_token_id_corpus_end_to_end(blank):
    ws = blank
    seed_tokens(ws, records=150)
    snap = build_approved(ws)
    manifest = snap.manifest
    assert manifest.record_schema_document == TOKEN_RECORDS
    assert manifest.record_schema == TOKEN_RECORDS.digest()
    release = write(ws, snap.digest)
    report = verify_release(ws, release.digest, actor="test", workers=0)
    assert report.outcome == "VERIFIED", report.failing
    fmt = rr.ShardFormat(TOKEN_RECORDS)
    assert release.document()["recordSchema"] == fmt.digest
    records = _members_of_release(ws, release)
    assert records.schema.remove_metadata().equals(fmt.arrow_schema)
    # Exact token counts: the number of ids each record stores, read back independently.
    catalog = open_catalog(
        ws.config["sources"][0]["catalogUri"], ws.config["sources"][0]["warehouse"]
    )
    source = catalog.load_table("corpus.tokenized").scan().to_arrow().to_pylist()
    lengths = {r["sample_id"]: len(r["ids"]) for r in source}
    kept = {k: n for k, n in lengths.items() if 8 <= n <= 4096}
    assert records.num_rows == len(kept) == manifest.member_count
    assert release.document()["totals"]["tokens"] == sum(kept.values())
    for row in records.to_pylist()[:20]:
        assert row["tokens"] == kept[row["sampleId"]]
        assert row["logicalContentDigest"] == ref.content_digest(row, TOKEN_RECORDS)


def test_binary_corpus_end_to_end(blank):
    ws = blank
    seed_images(ws, objects=3, per_object=20)
    snap = build_approved(ws)
    assert snap.manifest.record_schema_document == IMAGE_RECORDS
    release = write(ws, snap.digest)
    report = verify_release(ws, release.digest, actor="test", workers=0)
    assert report.outcome == "VERIFIED", report.failing
    records = _members_of_release(ws, release).to_pylist()
    assert {r["label"] for r in records} == {"bird", "cat", "dog"}  # "noise" not selected
    assert len(records) == 45 and release.document()["totals"]["tokens"] == 0
    assert any(r["caption"] is None for r in records)
    for row in records:
        assert row["image"].startswith(b"\x89PNG\r\n\x1a\n")
        assert row["logicalContentDigest"] == ref.content_digest(row, IMAGE_RECORDS)


def _put_jsonl(ws, key, rows):
    return ws.store.create(key, ("\n".join(json.dumps(r) for r in rows) + "\n").encode())


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"image": "not base64!"}, "field 'image' is not a valid binary"),
        ({"image": base64.b64encode(b"x").decode() + "\n"}, "field 'image' is not a valid binary"),
        ({"width": 2**31}, "field 'width' is not a valid int32"),
        ({"width": True}, "field 'width' is not a valid int32"),
        ({"width": None}, "field 'width' is missing or null"),
        ({"score": "high"}, "field 'score' is not a valid float64"),
        ({"caption": 3}, "field 'caption' is not a valid string"),
    ],
)
def test_a_badly_typed_binary_record_is_refused_naming_the_row(blank, change, why):
    ws = blank
    seed_images(ws, objects=1, per_object=4)
    good = {
        "id": "images/x",
        "image": base64.b64encode(b"png").decode(),
        "mime": "image/png",
        "width": 1,
        "height": 1,
        "score": 0.5,
        "caption": None,
        "label": "cat",
    }
    version = _put_jsonl(
        ws, f"{PREFIX}zz-hostile.jsonl", [good, {**good, "id": "images/y", **change}]
    )
    with pytest.raises(RejectedError) as err:
        build(ws)
    assert err.value.check == "source-row" and err.value.exit_code == 3
    assert err.value.object == f"images:{PREFIX}zz-hostile.jsonl@{version.version_id} line 2"
    assert str(err.value).startswith(f"source row refused: {why}")


def test_a_token_id_outside_uint32_is_refused(blank):
    ws = blank
    seed_tokens(ws, records=20)
    cfg = ws.config["sources"][0]
    table = open_catalog(cfg["catalogUri"], cfg["warehouse"]).load_table("corpus.tokenized")
    bad = pa.table(
        {
            "sample_id": ["tokens-eu/bad"],
            "ids": pa.array([[1, 2**32]], pa.list_(pa.int64())),
            "domain": ["support"],
        },
        schema=table.schema().as_arrow(),
    )
    table.append(bad)
    with pytest.raises(RejectedError) as err:
        build(ws)
    assert err.value.check == "source-row" and err.value.exit_code == 3
    assert "record schema's types" in str(err.value)


def test_a_manifest_whose_record_schema_digest_is_not_its_document_is_refused(blank):
    ws = blank
    seed_images(ws, objects=1, per_object=8)
    body = build(ws).manifest.to_json()
    body["recordSchemaDocument"] = {**body["recordSchemaDocument"], "label": "mime"}
    with pytest.raises(RejectedError) as err:
        mf.from_payload(body)
    assert err.value.check == "record-schema" and err.value.digest == body["recordSchema"]


def test_a_tampered_tokenizer_is_refused_before_counting(ws):
    """The demo text corpus counts tokens with its trained tokenizer; bytes that no longer
    hash to the pinned digest stop the release writer (exit 3), naming the digest."""
    snap = build_approved(ws)
    tokens = snap.manifest.record_schema_document.tokens
    assert tokens.kind == "tokenizer"
    artifact = snap.manifest.artifact("tokenizer", tokens.tokenizer)
    path = ws.store.local_path(artifact.content_ref.key, artifact.object_version)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes().replace(b'"vocab"', b'"vocab" ', 1))
    with pytest.raises(IntegrityError) as err:
        write(ws, snap.digest)
    assert err.value.exit_code == 3 and err.value.digest == tokens.tokenizer


def test_record_schema_refuses_what_it_cannot_encode():
    doc = TOKEN_RECORDS.to_json()
    for broken in (
        {**doc, "fields": [*doc["fields"], {"name": "m", "type": "map<string,int>"}]},
        {**doc, "content": ["sampleId"]},
        {**doc, "tokens": {"kind": "token-ids", "column": "domain"}},
        {**doc, "fields": [*doc["fields"], {"name": "split", "type": "string"}]},
        {**doc, "label": "nope"},
        {**doc, "content": []},
        {**doc, "content": ["ids", "ids"]},
        {**doc, "name": ""},
        {**doc, "name": "n" * 129},
        {**doc, "fields": [{**doc["fields"][0], "name": "s" * 129}, *doc["fields"]]},
        {**doc, "fields": [*doc["fields"], {"name": "", "type": "string"}]},
        {**doc, "tokens": {"kind": "none", "column": "ids"}},
        {
            **doc,
            "tokens": {"kind": "token-ids", "column": "ids", "tokenizer": "sha256:" + "0" * 64},
        },
        {
            **doc,
            "fields": [
                *doc["fields"][:1],
                {"name": "ids", "type": "list<uint32>", "nullable": True},
                *doc["fields"][2:],
            ],
        },
    ):
        with pytest.raises(RejectedError) as err:
            RecordSchema.parse(broken)
        assert err.value.check == "schema"
    # The bounds themselves are accepted.
    assert RecordSchema.parse({**doc, "name": "n" * 128}).name == "n" * 128


def test_a_retained_snapshot_holds_its_tokenizer_for_garbage_collection(ws):
    snap = build_approved(ws)
    manifest = snap.manifest
    digest = manifest.record_schema_document.tokens.tokenizer
    ref = manifest.artifact("tokenizer", digest)
    with ws.db.tx() as conn:
        refs = version_refs(ws, conn, "snapshot", snap.digest)
    held = {(r.key, r.version_id) for r in refs if r.role == "tokenizer"}
    assert held == {(ref.content_ref.key, ref.object_version)}


@pytest.mark.parametrize(
    "forgery",
    [
        lambda body: body["recordSchemaDocument"]["records"].__setitem__("label", None),
        lambda body: body.__setitem__("memberSchema", "sha256:" + "1" * 64),
        lambda body: body.__setitem__("recordSchema", "sha256:" + "2" * 64),
    ],
    ids=["document", "member-schema", "digest"],
)
def test_a_root_whose_record_schema_is_not_its_snapshots_is_mixed(ws, forgery):
    """Signed with the trusted key, so only the verifier's own derivation (from the
    snapshot's record schema) can catch it."""
    snap = build_approved(ws)
    release = write(ws, snap.digest)
    forged = forge(ws, release, forgery)
    report = verify_release(ws, forged.digest, actor="test", workers=0)
    assert report.outcome == "INVALID"
    assert report.counts["mixedRecordSchemas"] >= 1
