"""The in-toto/SLSA statement of a verified release: subjects the root and every shard by
digest, issued and signed by the verifier key, refused after any change."""

import base64
import json
import os
import subprocess
import sys

import pytest
from support.releases import write
from support.snapshots import build_approved
from support.workspaces import make_workspace

from relgate.catalog.audit import record_report
from relgate.errors import IntegrityError, NotFoundError, RejectedError
from relgate.integrity.statement import (
    MATERIALS_CHECK,
    STATEMENT_CHECK,
    SUBJECT_CHECK,
    Statement,
    sign_statement,
)
from relgate.release.verify import attest
from relgate.release.verify.verifier import verify_release

RELGATE = [sys.executable, "-m", "relgate.cli"]


def _verified(ws, snapshot):
    release = write(ws, snapshot.digest)
    report = verify_release(ws, release.digest, workers=0, actor="test")
    assert report.ok, report.failing
    return release, report


def _record(ws, root, envelope) -> None:
    ref = ws.cas.put(json.dumps(envelope, sort_keys=True).encode())
    with ws.db.tx() as conn:
        record_report(conn, attest.REPORT_KIND, root, ref.digest, ref.version_id, True)


def test_release_statement_binds_root_and_every_shard(ws, snapshot):
    release, report = _verified(ws, snapshot)
    prov = attest.verify_provenance(ws, release.digest)
    assert prov.statement_digest == report.provenance_digest
    statement = prov.statement
    subjects = {d.name: d.sha256 for d in statement.subject}
    assert subjects.pop(attest.SUBJECT_ROOT) == release.digest
    assert subjects == {d["id"]: d["digest"] for d in release.document()["shards"]}
    assert [m.sha256 for m in statement.materials] == [snapshot.digest]
    assert statement.builder_id.endswith("/release-verifier/" + ws.key("verifier").keyid)
    byproducts = statement.predicate.run_details.byproducts or ()
    assert [b.sha256 for b in byproducts] == [report.report_digest]


def test_release_statement_changes_are_refused(ws, snapshot):
    release, _ = _verified(ws, snapshot)
    prov = attest.verify_provenance(ws, release.digest)
    verifier = ws.key("verifier")
    body = prov.statement.to_json()
    body["subject"] = body["subject"][:-1]  # a shard left out
    _record(ws, release.digest, sign_statement(Statement.model_validate(body), verifier))
    with pytest.raises(IntegrityError) as err:
        attest.verify_provenance(ws, release.digest)
    assert err.value.check == SUBJECT_CHECK
    assert err.value.digest == release.document()["shards"][-1]["digest"]
    body = prov.statement.to_json()
    body["predicate"]["buildDefinition"]["resolvedDependencies"][0]["digest"]["sha256"] = "0" * 64
    _record(ws, release.digest, sign_statement(Statement.model_validate(body), verifier))
    with pytest.raises(IntegrityError) as err:
        attest.verify_provenance(ws, release.digest)
    assert err.value.check == MATERIALS_CHECK
    # The builder key is trusted, but not for a release statement: refused.
    _record(ws, release.digest, sign_statement(prov.statement, ws.signing_key))
    with pytest.raises(RejectedError) as err:
        attest.verify_provenance(ws, release.digest)
    assert err.value.exit_code == 3


def test_unverified_release_has_no_statement(ws, snapshot):
    release = write(ws, snapshot.digest)
    with pytest.raises(NotFoundError) as err:
        attest.verify_provenance(ws, release.digest)
    assert err.value.check == STATEMENT_CHECK and err.value.exit_code == 3


def test_cli_release_provenance_and_a_tampered_byte(tmp_path):
    ws = make_workspace(tmp_path / "home")
    try:
        release, _ = _verified(ws, build_approved(ws))

        def cli(expect):
            proc = subprocess.run(
                [
                    *RELGATE,
                    "--home",
                    str(ws.home),
                    "release",
                    "provenance",
                    release.digest,
                    "--json",
                ],
                capture_output=True,
                text=True,
                env={**os.environ, "RELGATE_HASH_WORKERS": "1"},
                check=False,
            )
            assert proc.returncode == expect, (proc.stdout, proc.stderr)
            return json.loads(proc.stdout)

        out = cli(0)
        assert out["subjectDigest"] == release.digest
        assert out["statement"]["subject"][0]["digest"]["sha256"] == release.digest[7:]
        prov = attest.verify_provenance(ws, release.digest)
        envelope = json.loads(ws.cas.get(prov.statement_digest, prov.statement_version))
        payload = bytearray(base64.b64decode(envelope["payload"]))
        payload[-3] ^= 0x01
        envelope["payload"] = base64.b64encode(bytes(payload)).decode()
        _record(ws, release.digest, envelope)
        refused = cli(3)
        assert refused["check"] == "signature-valid"
        assert refused["digest"] == ws.key("verifier").keyid
        assert refused["object"].startswith("cas/sha256/")
    finally:
        ws.close()
