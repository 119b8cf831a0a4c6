"""The in-toto/SLSA statement of a real snapshot build (Iceberg on SQLite through pyiceberg,
a versioned object prefix and a CDC log): verified with the builder key, refused with any
other key or after any change, subjects and materials by digest only."""

import base64
import hashlib
import json
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from relgate_trust.digests import sha256_digest
from support.cli import relgate_cli as _cli
from support.snapshots import build
from support.workspaces import TRANSFORM_TAGS, make_workspace

from relgate.catalog.audit import record_report
from relgate.errors import IntegrityError, RejectedError
from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.signing import Role, SigningKey, TrustedKeys, sign_envelope
from relgate.integrity.statement import (
    MATERIAL_DIGEST_CHECK,
    MATERIALS_CHECK,
    PAYLOAD_TYPE,
    SUBJECT_CHECK,
    Statement,
    open_statement,
    sign_statement,
)
from relgate.snapshot import provenance as sp
from relgate.snapshot.build import source_configs

RELGATE = [sys.executable, "-m", "relgate.cli"]


def _strings(node):
    """Every string value and key in a decoded JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


def _mutable_names(ws):
    """Configured source ids, table names, prefixes and transform tags."""
    ids, others = set(), set(TRANSFORM_TAGS)
    for cfg in source_configs(ws).values():
        ids.add(cfg["id"])
        others.update(str(cfg[k]) for k in ("table", "catalogUri", "warehouse") if k in cfg)
    return ids, others


def _replace_statement(ws, digest, envelope: dict) -> str:
    """Store ``envelope`` content-addressed and record it as the snapshot's newest statement."""
    ref = ws.cas.put(json.dumps(envelope, sort_keys=True).encode())
    with ws.db.tx() as conn:
        record_report(conn, sp.REPORT_KIND, digest, ref.digest, ref.version_id, True)
    return ref.digest


def _statement_json(ws, prov):
    return json.loads(ws.cas.get(prov.statement_digest, prov.statement_version))


def test_statement_verifies_and_names_only_digests(ws):
    result = build(ws)
    manifest = result.manifest
    prov = sp.verify_provenance(ws, result.digest)
    statement = prov.statement
    # Subjects: the manifest and its membership table, by digest.
    by_name = {d.name: d.sha256 for d in statement.subject}
    assert by_name == {
        sp.SUBJECT_MANIFEST: manifest.snapshot_id,
        sp.SUBJECT_MEMBERS: manifest.members_ref.digest,
    }
    # Builder: the id names the builder key, and the version is relgate's.
    assert statement.builder_id.endswith("/snapshot-builder/" + ws.signing_key.keyid)
    assert set(statement.predicate.run_details.builder.version) == {"relgate"}
    # Every material is a sha256 digest; the count matches the pins.
    body = statement.to_json()
    materials = body["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert prov.materials == len(materials) > 0
    for material in materials:
        assert set(material["digest"]) == {"sha256"}
        assert len(material["digest"]["sha256"]) == 64
    # No identifier anywhere is a mutable name.
    ids, others = _mutable_names(ws)
    for text in _strings(body):
        assert text not in ids, text
        assert not any(name in text for name in others), text
    # The transform and every object version appear by digest.
    transform = manifest.transform_image.rpartition("@")[2]
    assert {"uri": f"transform:{transform}", "digest": {"sha256": transform[7:]}} in materials
    tokenizer = manifest.record_schema_document.tokens.tokenizer  # the demo counts with one
    assert {"uri": f"tokenizer:{tokenizer}", "digest": {"sha256": tokenizer[7:]}} in materials
    forum = manifest.source("forum")
    pins = json.loads(
        ws.cas.get(
            forum.objects.uri.replace("cas://sha256/", "sha256:"), forum.objects.object_version
        )
    )
    for key, version, digest, size in pins["objects"]:
        assert {
            "uri": f"{key}@{version}",
            "digest": {"sha256": digest[7:]},
            "annotations": {"size": size},
        } in materials
    # CDC segments: bytes digest of the pinned version and their offset range.
    cdc = [m for m in materials if m.get("uri", "").startswith("cdc/")]
    assert cdc and cdc[0]["annotations"]["offsetLow"] == 0
    assert cdc[-1]["annotations"]["offsetHigh"] == manifest.source("chat-cdc").high_offset
    for m in cdc:
        key, _, version = m["uri"].rpartition("@")
        assert sha256_digest(ws.store.get(key, version))[7:] == m["digest"]["sha256"]
    # PROV lineage edges are digests too (the canonical source entries).
    derived = [d.entity for d in manifest.provenance.was_derived_from]
    assert derived == [entry.digest() for entry in manifest.sources]


def test_iceberg_material_is_the_metadata_file_digest(ws):
    manifest = build(ws).manifest
    entry = manifest.source("tickets-eu")
    meta = entry.metadata_file
    data = Path(urlparse(meta.location).path).read_bytes()
    assert meta.file_digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert meta.size == len(data)
    statement = sp.verify_provenance(ws, manifest.snapshot_id).statement
    iceberg = [m for m in statement.materials if (m.uri or "").startswith("iceberg-metadata:")]
    assert [m.sha256 for m in iceberg] == [meta.file_digest]
    assert iceberg[0].annotations == {"tableSnapshot": entry.table_snapshot, "size": len(data)}


def test_statement_is_refused_with_another_key(ws):
    result = build(ws)
    prov = sp.verify_provenance(ws, result.digest)
    data = ws.cas.get(prov.statement_digest, prov.statement_version)
    other = SigningKey.generate(Role.BUILDER)
    with pytest.raises(RejectedError) as err:
        open_statement(
            data,
            TrustedKeys.of(other.public_key, role=Role.BUILDER),
            role=Role.BUILDER,
            kind=sp.BUILDER_KIND,
            subject="statement",
        )
    assert err.value.exit_code == 3 and err.value.check == "signature-trusted"
    # Signed by a key the workspace does not trust: refused as recorded, naming the key.
    forged = sign_statement(prov.statement, other)
    _replace_statement(ws, result.digest, forged)
    with pytest.raises(RejectedError) as err:
        sp.verify_provenance(ws, result.digest)
    assert err.value.exit_code == 3 and err.value.digest == other.keyid
    # Signed by a trusted key of another role (the verifier): refused too.
    _replace_statement(ws, result.digest, sign_statement(prov.statement, ws.key("verifier")))
    with pytest.raises(RejectedError) as err:
        sp.verify_provenance(ws, result.digest)
    assert err.value.exit_code == 3


def _resigned(ws, prov, change) -> dict:
    body = prov.statement.to_json()
    change(body)
    return sign_statement(Statement.model_validate(body), ws.signing_key)


def test_a_dropped_material_fails_the_cross_check(ws):
    result = build(ws)
    prov = sp.verify_provenance(ws, result.digest)
    dropped = prov.statement.materials[1].sha256

    def drop(body):
        del body["predicate"]["buildDefinition"]["resolvedDependencies"][1]

    _replace_statement(ws, result.digest, _resigned(ws, prov, drop))
    with pytest.raises(IntegrityError) as err:
        sp.verify_provenance(ws, result.digest)
    assert err.value.check == MATERIALS_CHECK and err.value.digest == dropped


def test_a_statement_for_another_snapshot_is_refused(ws):
    first = build(ws)
    second = build(ws, transform="registry.local/identity:v1")
    assert first.digest != second.digest
    prov = sp.verify_provenance(ws, first.digest)
    _replace_statement(ws, second.digest, _statement_json(ws, prov))
    with pytest.raises(IntegrityError) as err:
        sp.verify_provenance(ws, second.digest)
    assert err.value.check == SUBJECT_CHECK and err.value.digest == second.digest


def test_a_material_without_a_digest_is_refused(ws):
    result = build(ws)
    prov = sp.verify_provenance(ws, result.digest)
    body = prov.statement.to_json()
    del body["predicate"]["buildDefinition"]["resolvedDependencies"][0]["digest"]
    # Signed by the trusted builder key over the canonical bytes of the changed statement.
    _replace_statement(
        ws, result.digest, sign_envelope(PAYLOAD_TYPE, canonical_bytes(body), ws.signing_key)
    )
    with pytest.raises(RejectedError) as err:
        sp.verify_provenance(ws, result.digest)
    assert err.value.check == MATERIAL_DIGEST_CHECK


def test_cli_prints_the_statement_and_refuses_a_tampered_byte(tmp_path):
    ws = make_workspace(tmp_path / "home")
    try:
        result = build(ws)
        out = _cli(ws.home, "snapshot", "provenance", result.digest, expect=0)
        assert out["statement"]["_type"] == "https://in-toto.io/Statement/v1"
        assert out["statement"]["predicateType"] == "https://slsa.dev/provenance/v1"
        assert out["materials"] == len(
            out["statement"]["predicate"]["buildDefinition"]["resolvedDependencies"]
        )
        prov = sp.verify_provenance(ws, result.digest)
        envelope = _statement_json(ws, prov)
        payload = bytearray(base64.b64decode(envelope["payload"]))
        index = payload.index(b"sha256") + len(b'sha256":"')  # one hex digit of a digest
        payload[index] = ord("0") if payload[index] != ord("0") else ord("1")
        envelope["payload"] = base64.b64encode(bytes(payload)).decode()
        _replace_statement(ws, result.digest, envelope)
        refused = _cli(ws.home, "snapshot", "provenance", result.digest, expect=3)
        assert refused["check"] == "signature-valid"
        assert refused["digest"] == ws.signing_key.keyid
        assert refused["object"].startswith("cas/sha256/")
    finally:
        ws.close()
