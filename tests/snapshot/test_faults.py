"""The Snapshot rows of DESIGN.md's fault matrix, each injected for real."""

import base64
import json
import os

import polars as pl
import pytest
from support.snapshots import build, build_validated, state_of

from relgate.catalog.snapshot_table import insert_snapshot
from relgate.documents import snapshot_manifest as mf
from relgate.documents.membership import put_membership, tuple_root
from relgate.errors import IntegrityError, RejectedError
from relgate.integrity.canonical import canonical_bytes
from relgate.objects.cas import digest_of_uri
from relgate.release.verify.verifier import verify_release
from relgate.release.writer import write_release
from relgate.snapshot import activation as lifecycle
from relgate.snapshot.build import BuildSpec, build_snapshot, freeze
from relgate.snapshot.replay import replay
from relgate.snapshot.transform_tags import tag_transform
from relgate.snapshot.validate import validate_snapshot
from relgate.sources.cdc import append_segment
from relgate.sources.iceberg import open_catalog
from relgate.transforms.builtin import transform_code_digest


def _members(ws, result):
    return ws.membership.read(result.manifest.members_ref)


def test_objects_added_and_deleted_during_the_scan(ws):
    spec = BuildSpec.from_config(ws.config)
    frozen = freeze(ws, spec)  # fences and pins taken...
    # ...then, while the build is running, one object is added and one deleted.
    ws.store.put(
        "raw/forum/thread-late.jsonl",
        b'{"id": "forum/late-1", "lang": "en", "text": "posted while the scan was running"}\n',
    )
    deleted_key = "raw/forum/thread-0001.jsonl"
    deleted_ids = [
        json.loads(line)["id"]
        for line in ws.store.get(deleted_key, ws.store.head(deleted_key).version_id).splitlines()
    ]
    ws.store.delete(deleted_key)
    result = build_snapshot(ws, spec, actor="test", frozen=frozen)
    ids = set(_members(ws, result)["sampleId"].to_list())
    assert "forum/late-1" not in ids  # belongs to the next snapshot
    assert ids & set(deleted_ids)  # still read through the pinned version
    assert validate_snapshot(ws, result.digest, actor="t").outcome == "VALIDATED"
    next_ids = set(_members(ws, build_validated(ws))["sampleId"].to_list())
    assert "forum/late-1" in next_ids and not next_ids & set(deleted_ids)


def test_content_replaced_under_a_reused_object_name(ws):
    result = build_validated(ws)
    key = "raw/forum/thread-0002.jsonl"
    old = ws.store.get(key, ws.store.head(key).version_id)
    ws.store.put(key, old.replace(b'"lang": "en"', b'"lang": "de"').replace(b"router", b"toaster"))
    # The pinned version is still what the snapshot reads: validation and replay hold.
    assert validate_snapshot(ws, result.digest, actor="t").outcome == "VALIDATED"
    assert replay(ws, result.digest).identical


def test_pinned_object_bytes_changed_in_place_are_caught(ws):
    result = build_validated(ws)
    entry = result.manifest.source("forum").to_json()
    pins = json.loads(ws.cas.get(*_cas(entry["objects"])))["objects"]
    key, version, _digest, _size = pins[0]
    path = ws.store.local_path(key, version)
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:  # a store without real versioning overwrote the bytes
        fh.seek(10)
        fh.write(b"X")
    report = validate_snapshot(ws, result.digest, actor="t")
    assert report.outcome == "REJECTED"
    assert report.checks["unreadableSources"] == 1
    assert state_of(ws, result.digest) == "REJECTED"


def _cas(ref):

    return digest_of_uri(ref["uri"]), ref["objectVersion"]


def test_cdc_offset_gap_is_an_error(ws):
    append_segment(
        ws.store,
        "cdc/chat/",
        [
            {
                "offset": 75,
                "commit": 9000,
                "op": "upsert",
                "id": "chat/gap",
                "lang": "en",
                "text": "after a gap in the log",
            }
        ],
    )
    with pytest.raises(RejectedError) as err:
        build(ws)
    assert err.value.check == "cdc-contiguous"
    assert err.value.details["expected"] == 60 and err.value.details["found"] == 75
    assert err.value.details["build"]["state"] == "INCOMPLETE"


def test_transform_tag_that_now_resolves_elsewhere_is_refused(ws):
    tag_transform(ws.db, "registry.local/normalize:v1", transform_code_digest("identity"))
    with pytest.raises(RejectedError) as err:
        build(ws)
    assert err.value.check == "transform-digest"
    assert err.value.digest == transform_code_digest("identity")


def _forge(ws, base, members: pl.DataFrame):
    """A signed manifest (trusted key) over a hand-made membership table."""
    ref = put_membership(ws.cas, members.to_arrow())
    body = dict(base.manifest.body)
    body["members"] = {
        **body["members"],
        "uri": ref.uri,
        "objectVersion": ref.version_id,
        "size": ref.size,
        "count": members.height,
        "tupleRoot": tuple_root(members, body["recordSchema"]),
    }
    body["splits"] = {
        r["split"]: r["len"] for r in members.group_by("split").len().iter_rows(named=True)
    }
    generated = {**body["provenance"]["wasGeneratedBy"], "buildId": "forged"}
    body["provenance"] = {**body["provenance"], "wasGeneratedBy": generated}
    sealed = mf.seal(body)
    version = mf.store_envelope(ws.store, sealed, mf.sign(sealed, ws.signing_key))
    with ws.db.tx() as conn:
        insert_snapshot(conn, sealed, version, actor="forger")
    return sealed.digest


def test_one_sample_id_in_two_splits(ws):
    base = build_validated(ws)
    members = _members(ws, base)
    row = members.head(1).with_columns(
        pl.lit("test" if members["split"][0] != "test" else "train").alias("split")
    )
    digest = _forge(ws, base, pl.concat([members, row]).sort("sampleId"))
    report = validate_snapshot(ws, digest, actor="t")
    assert report.outcome == "REJECTED"
    assert report.checks["idsInSeveralSplits"] == 1
    assert report.checks["duplicateIds"] == 1


def test_truncated_membership_table(ws):
    result = build(ws)
    ref = result.manifest.members_ref
    path = ws.store.local_path(ref.key, ref.version_id)
    size = path.stat().st_size
    os.truncate(path, size // 2)
    report = validate_snapshot(ws, result.digest, actor="t")
    assert report.outcome == "REJECTED"
    assert report.checks.get("fatal:storage-digest") == 1
    assert state_of(ws, result.digest) == "REJECTED"


def test_manifest_tampered_after_signing(ws, tmp_path):
    result = build(ws)
    key = mf.envelope_key(result.digest)
    envelope = json.loads(ws.store.get(key, ws.store.head(key).version_id))
    body = json.loads(base64.b64decode(envelope["payload"]))
    body["members"]["count"] += 1
    envelope["payload"] = base64.b64encode(canonical_bytes(body)).decode()
    with pytest.raises(IntegrityError) as err:
        mf.open_envelope(envelope, ws.trusted_keys)
    assert err.value.check == "signature-valid"
    # The same tampering applied to the stored copy fails validation.
    path = ws.store.local_path(key, ws.store.head(key).version_id)
    os.chmod(path, 0o644)
    path.write_text(json.dumps(envelope))
    report = validate_snapshot(ws, result.digest, actor="t")
    assert report.outcome == "REJECTED" and report.checks.get("fatal:signature-valid") == 1


def test_resigned_manifest_with_wrong_digest_is_caught(ws):
    result = build(ws)
    body = dict(result.manifest.body)
    body["purpose"] = "something-else"  # snapshotId left as it was
    envelope = mf.sign(mf.SnapshotManifest.model_validate(body), ws.signing_key)
    with pytest.raises(IntegrityError) as err:
        mf.open_envelope(envelope, ws.trusted_keys)
    assert err.value.check == "manifest-digest"


def test_late_event_older_than_the_watermark_makes_it_incomplete(ws):
    result = build(ws)
    commit_wm = result.manifest.source("chat-cdc").to_json()["commitWatermark"]
    # Offset 60 continues the log, but its commit position predates the pinned watermark.
    append_segment(
        ws.store,
        "cdc/chat/",
        [
            {
                "offset": 60,
                "commit": commit_wm - 5,
                "op": "upsert",
                "id": "chat/late",
                "lang": "en",
                "text": "a message committed before the watermark",
            }
        ],
    )
    report = validate_snapshot(ws, result.digest, actor="t")
    assert report.outcome == "INCOMPLETE"
    assert report.checks["lateEvents"] == 1
    assert state_of(ws, result.digest) == "INCOMPLETE"


def test_late_event_exactly_at_the_watermark_makes_it_incomplete(ws):
    """The boundary is inclusive: an event committed *at* the watermark belonged to this
    snapshot's boundary, so arriving after pinning it is late (``<=``, not ``<``)."""
    result = build(ws)
    commit_wm = result.manifest.source("chat-cdc").to_json()["commitWatermark"]
    append_segment(
        ws.store,
        "cdc/chat/",
        [
            {
                "offset": 60,
                "commit": commit_wm,
                "op": "upsert",
                "id": "chat/at-the-watermark",
                "lang": "en",
                "text": "a message committed exactly at the watermark",
            }
        ],
    )
    report = validate_snapshot(ws, result.digest, actor="t")
    assert report.outcome == "INCOMPLETE" and report.checks["lateEvents"] == 1
    assert state_of(ws, result.digest) == "INCOMPLETE"


def test_new_events_after_the_watermark_belong_to_the_next_snapshot(ws):
    result = build(ws)
    commit_wm = result.manifest.source("chat-cdc").to_json()["commitWatermark"]
    append_segment(
        ws.store,
        "cdc/chat/",
        [
            {
                "offset": 60,
                "commit": commit_wm + 1,
                "op": "upsert",
                "id": "chat/next",
                "lang": "en",
                "text": "a message for the next snapshot",
            }
        ],
    )
    assert validate_snapshot(ws, result.digest, actor="t").outcome == "VALIDATED"
    assert "chat/next" in _members(ws, build_validated(ws))["sampleId"].to_list()


def test_unknown_origin_is_rejected(ws):
    base = build_validated(ws)
    members = _members(ws, base)
    forged = members.with_columns(
        pl.when(pl.col("sampleId") == members["sampleId"][0])
        .then(pl.lit("shadow-source"))
        .otherwise(pl.col("sourceId"))
        .alias("sourceId")
    )
    report = validate_snapshot(ws, _forge(ws, base, forged), actor="t")
    assert report.outcome == "REJECTED" and report.checks["unknownOrigins"] == 1


def test_expired_iceberg_snapshot_is_unreadable(ws):

    result = build_validated(ws)
    cfg = next(s for s in ws.config["sources"] if s["id"] == "tickets-eu")
    table = open_catalog(cfg["catalogUri"], cfg["warehouse"]).load_table(cfg["table"])
    pinned = int(result.manifest.source("tickets-eu").to_json()["tableSnapshot"].split(":")[1])
    import pyarrow as pa

    table.append(
        pa.table(
            {
                "sample_id": ["tickets-eu/x"],
                "lang": ["en"],
                "text": ["one more ticket for the table"],
            },
            schema=table.schema().as_arrow(),
        )
    )
    table.maintenance.expire_snapshots().by_id(pinned).commit()
    report = validate_snapshot(ws, result.digest, actor="t")
    assert report.outcome == "REJECTED" and report.checks["unreadableSources"] == 1


# -- hostile source rows and identifiers (issue 8, item 10) --------------------------------


def _cli(home, *args, expect):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "relgate.cli", "--home", str(home), *args, "--json"],
        capture_output=True,
        env={**os.environ, "RELGATE_HASH_WORKERS": "1"},
    )
    assert proc.returncode == expect, (args, proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"id": "forum/bad", "lang": "en", "text": "caf\xe9"}', "not valid UTF-8"),
        (b'{"id": "forum/bad", "lang": "en", "text": ', "not JSON"),
        (b'["forum/bad", "en", "text"]', "not a JSON object"),
        (b'{"lang": "en", "text": "no id here"}', "no id"),
        (b'{"id": "", "lang": "en", "text": "empty id"}', "bad id (empty)"),
        (b'{"id": "forum/\\u0000nul", "lang": "en", "text": "t"}', "bad id (holds control"),
        (b'{"id": "' + b"x" * 100_000 + b'", "lang": "en", "text": "t"}', "bad id (longer than"),
        (b'{"id": 17, "lang": "en", "text": "t"}', "bad id (not a string"),
        (b'{"id": "forum/ok", "lang": "en", "text": null}', "field 'text' is missing or null"),
        (b'{"id": "forum/ok", "lang": "en"}', "field 'text' is missing or null"),
        (b'{"id": "forum/ok", "lang": "en", "text": 7}', "field 'text' is not a valid string"),
        (b'{"id": "forum/ok", "lang": "en", "text": "\\ud800"}', "field 'text' is not a valid"),
    ],
)
def test_bad_object_source_row_is_refused_naming_source_version_and_line(ws, line, why):
    good = b'{"id": "forum/fine", "lang": "en", "text": "fine"}'
    version = ws.store.create(
        "raw/forum/zz-hostile.jsonl", good + b"\n\n" + line + b"\n"
    ).version_id
    out = _refusal(ws, why)
    assert out["check"] == "source-row"
    assert out["object"] == f"forum:raw/forum/zz-hostile.jsonl@{version} line 3"
    assert out["message"].startswith(f"source row refused: {why}")
    assert out["details"]["build"]["state"] == "REJECTED"
    assert "x" * 100 not in json.dumps(out)  # a 100k id is never echoed


#: the refusals also run through the CLI (exit 3, one JSON line); the rest in process, where
#: the same RejectedError carries the same check, object and message (saves ~2 s a case)
CLI_REFUSALS = ("not valid UTF-8", "bad id (longer than", "no id", "field 'op'")


def _refusal(ws, why: str) -> dict:
    """The build's refusal as the CLI prints it: through the CLI for CLI_REFUSALS, else the
    in-process build's RejectedError (the CLI prints exactly its to_json())."""
    if why in CLI_REFUSALS:
        return _cli(ws.home, "snapshot", "build", expect=3)
    with pytest.raises(RejectedError) as caught:
        build(ws)
    return caught.value.to_json()


@pytest.mark.parametrize(
    ("event", "why"),
    [
        ({"offset": 60, "commit": 5000, "op": "upsert", "lang": "en", "text": "t"}, "no id"),
        (
            {
                "offset": 60,
                "commit": 5000,
                "op": "upsert",
                "id": "a\x01b",
                "lang": "en",
                "text": "t",
            },
            "bad id",
        ),
        (
            {"offset": "60", "commit": 5000, "op": "upsert", "id": "c", "lang": "en", "text": "t"},
            "field 'offset'",
        ),
        ({"offset": 60, "commit": 5000, "op": "merge", "id": "c"}, "field 'op'"),
    ],
)
def test_bad_cdc_event_is_refused_naming_source_segment_and_line(ws, event, why):
    key = append_segment(ws.store, "cdc/chat/", [event])
    version = ws.store.head(key).version_id
    out = _refusal(ws, why)
    assert out["check"] == "source-row"
    assert out["object"] == f"chat-cdc:{key}@{version} line 1"
    assert why in out["message"]


def test_non_json_cdc_line_is_refused_not_an_internal_error(ws):
    key = "cdc/chat/00000000000000000060.jsonl"
    version = ws.store.create(key, b"\xff\xfe not json\n").version_id
    out = _cli(ws.home, "snapshot", "build", expect=3)
    assert (out["check"], out["object"]) == ("source-row", f"chat-cdc:{key}@{version} line 1")


def test_a_path_like_sample_id_stays_a_value(ws, tmp_path):
    """``../../etc/passwd`` is a legal id; it is stored, released, verified, tombstoned and
    looked up, and never becomes a file name or an object key anywhere."""

    evil = "../../etc/passwd"
    ws.store.create(
        "raw/forum/zz-path.jsonl",
        json.dumps({"id": evil, "lang": "en", "text": "a message with a hostile id"}).encode(),
    )
    before = {p for p in tmp_path.rglob("*")}
    result = build_validated(ws)
    assert evil in _members(ws, result)["sampleId"].to_list()
    lifecycle.approve(ws, result.digest, approver="alice")
    release = write_release(ws, result.digest, records_per_shard=40, actor="t")
    assert verify_release(ws, release.digest, workers=0, actor="t").state == "VERIFIED"
    lineage = _cli(ws.home, "lineage", evil, expect=0)
    assert result.digest in {v["digest"] for v in lineage["versions"]}
    created = {p for p in tmp_path.rglob("*")} - before
    assert not any("passwd" in str(p) or "etc" in p.parts for p in created)
    assert not any(k.key.endswith("passwd") for k in ws.store.list(""))
    assert not (tmp_path.parent / "etc").exists()


@pytest.mark.parametrize(
    ("ids", "reason"),
    [([""], "empty"), (["ok", "bad\x07bell"], "control"), (["a" * 600], "longer than")],
)
def test_bad_tombstone_ids_are_refused_and_nothing_moves(ws, ids, reason):
    # no snapshot needed: a refused id must not even reach the fence (which an accepted one
    # would advance, snapshot or not)
    before = _cli(ws.home, "fence", "show", expect=0)
    out = _cli(ws.home, "fence", "tombstone", "add", *ids, "--reason", "x", expect=3)
    assert out["check"] == "identifier" and reason in out["message"]
    assert _cli(ws.home, "fence", "show", expect=0) == before


def test_argv_that_is_not_utf8_is_refused_with_exit_3(ws):
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "relgate.cli",
            "--home",
            str(ws.home),
            "fence",
            "tombstone",
            "add",
            b"bad\xffid",
            "--reason",
            "x",
            "--json",
        ],
        capture_output=True,
    )
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["check"] == "identifier"
