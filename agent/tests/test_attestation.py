"""A handoff the deployer can verify: placement attestations signed with host keys, deployer
events signed by the coordinator, checked against the fleet CA (dev PKI, real keys)."""

from __future__ import annotations

import base64
import copy
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from relgate_trust import jcs
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import TrustedKeys
from test_cli import _run

from relgate_agent.attestation import (
    CHECK_ATTESTATION_DIGEST,
    CHECK_ATTESTATION_MALFORMED,
    CHECK_ATTESTATION_MISSING,
    CHECK_ATTESTATION_SIGNATURE,
    CHECK_ATTESTATION_SIGNER,
    CHECK_HANDOFF_MALFORMED,
    CHECK_HANDOFF_SIGNATURE,
    CHECK_HANDOFF_SIGNER,
    CHECK_HANDOFF_UNSIGNED,
    CertSigner,
    HandoffError,
    load_ca,
    removed_hosts,
    sign_event,
    sign_placement,
    verify_event,
    verify_event_bytes,
)
from relgate_agent.cli import EXIT_OK, EXIT_REJECTED
from relgate_agent.contracts import ProgressReport, RemovedHost
from relgate_agent.coordinator.jobstate import ReadyRefused
from relgate_agent.coordinator.service import Coordinator, CoordinatorConfig
from relgate_agent.identity.cabundle import TrustFile
from relgate_agent.pki import TlsFiles, ensure_dev_pki
from relgate_agent.staging.storage import bitmap_from_bits

DIGEST = "sha256:" + "a" * 64
HOSTS = {"h00": "r0", "h01": "r1"}


def _signer(pki: Path, name: str) -> CertSigner:
    return CertSigner.from_tls(TlsFiles.from_pki(pki, name))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fleet's dev PKI and another fleet's (a CA the deployer does not trust)."""
    pki = ensure_dev_pki(tmp_path_factory.mktemp("fleet"), HOSTS)
    other = ensure_dev_pki(tmp_path_factory.mktemp("other"), HOSTS)
    return {"pki": pki, "other": other, "ca": load_ca(pki / "ca.pem")}


def _attest(pki: Path, host: str, digest: str = DIGEST, signer_name: str = "") -> dict[str, Any]:
    return sign_placement(
        _signer(pki, signer_name or host),
        host_id=host,
        model="claude-x",
        version="v1",
        manifest_digest=digest,
        path=f"/models/claude-x/v1 on {host}",
        placed_at_ms=int(time.time() * 1000),
    )


def _event(
    pki: Path, attestations: dict[str, Any], signer: str = "coordinator", **extra: Any
) -> dict[str, Any]:
    event = {
        "type": "DistributionComplete",
        "eventId": "ev_1",
        "job": "dj_1",
        "model": "claude-x",
        "version": "v1",
        "manifestDigest": DIGEST,
        "readyHosts": sorted(HOSTS),
        "hostsTotal": 2,
        "attestations": attestations,
        **extra,
    }
    return sign_event(_signer(pki, signer), event, int(time.time() * 1000))


def _refused(doc: Any, ca: Any) -> str:
    with pytest.raises(HandoffError) as exc:
        verify_event(doc, ca)
    return exc.value.check


def test_events_and_attestations_verify_and_every_forgery_names_its_check(
    fleet: dict[str, Any],
) -> None:
    pki, other, ca = fleet["pki"], fleet["other"], fleet["ca"]
    good = {h: _attest(pki, h) for h in HOSTS}
    event = _event(pki, good)
    assert verify_event(event, ca)["readyHosts"] == ["h00", "h01"]
    assert verify_event_bytes(json.dumps(event).encode(), ca)["job"] == "dj_1"
    # the event itself
    unsigned = {k: v for k, v in event.items() if k != "signature"}
    assert _refused(unsigned, ca) == CHECK_HANDOFF_UNSIGNED
    for field, value in (
        ("readyHosts", ["h00"]),
        ("manifestDigest", "sha256:" + "b" * 64),
        ("hostsTotal", 3),
    ):
        assert _refused({**event, field: value}, ca) == CHECK_HANDOFF_SIGNATURE, field
    assert _refused(_event(pki, good, signer="h00"), ca) == CHECK_HANDOFF_SIGNER  # a host's key
    assert _refused(_event(other, good), ca) == CHECK_HANDOFF_SIGNER  # another fleet's CA
    # the attestations (each event below is validly signed by the coordinator)
    assert _refused(_event(pki, {"h00": good["h00"]}), ca) == CHECK_ATTESTATION_MISSING
    swapped = {**good, "h00": _attest(pki, "h00", signer_name="h01")}  # h01's key for h00
    assert _refused(_event(pki, swapped), ca) == CHECK_ATTESTATION_SIGNER
    foreign = {**good, "h01": _attest(other, "h01")}  # a host of another fleet
    assert _refused(_event(pki, foreign), ca) == CHECK_ATTESTATION_SIGNER
    stale = {**good, "h01": _attest(pki, "h01", digest="sha256:" + "c" * 64)}
    assert _refused(_event(pki, stale), ca) == CHECK_ATTESTATION_DIGEST
    tampered = copy.deepcopy(good)
    body = json.loads(base64.b64decode(tampered["h00"]["payload"]))
    body["path"] = "/elsewhere"  # canonical again: only the signature can tell
    tampered["h00"]["payload"] = base64.b64encode(jcs.dumps(body)).decode()
    assert _refused(_event(pki, tampered), ca) == CHECK_ATTESTATION_SIGNATURE


def test_removed_hosts_are_signed_and_each_malformed_one_is_refused(
    fleet: dict[str, Any],
) -> None:
    pki, ca = fleet["pki"], fleet["ca"]
    good = {h: _attest(pki, h) for h in HOSTS}
    lost = {"hostId": "h02", "reason": "evicted by operator:ops: rma", "removedAt": 1_790_000_000}
    event = _event(pki, good, removedHosts=[lost])
    assert removed_hosts(verify_event(event, ca)) == (
        RemovedHost("h02", "evicted by operator:ops: rma", 1_790_000_000),
    )
    assert removed_hosts(verify_event(_event(pki, good), ca)) == ()  # an event from before
    for forged in ([], [{**lost, "reason": "READY"}], [{**lost, "removedAt": 1}]):
        assert _refused({**event, "removedHosts": forged}, ca) == CHECK_HANDOFF_SIGNATURE
    # validly signed, but not what an event may say
    for bad in (
        "h02",
        ["h02"],
        [{**lost, "hostId": ""}],
        [{**lost, "reason": None}],
        [{**lost, "removedAt": "yesterday"}],
        [{**lost, "removedAt": True}],
        [{**lost, "removedAt": -1}],
        [{**lost, "hostId": "h00"}],  # a host named READY and removed
    ):
        assert _refused(_event(pki, good, removedHosts=bad), ca) == CHECK_HANDOFF_MALFORMED, bad


def test_verify_handoff_cli(
    fleet: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = fleet["pki"]
    event = _event(pki, {h: _attest(pki, h) for h in HOSTS})
    good, forged = tmp_path / "event.json", tmp_path / "forged.json"
    good.write_text(json.dumps(event))
    forged.write_text(json.dumps({**event, "readyHosts": ["h00", "h01", "h99"]}))
    ca = str(pki / "ca.pem")
    rc, out = _run(capsys, "verify-handoff", "--json", str(good), "--ca", ca)
    assert rc == EXIT_OK and out["verified"] is True and out["hostsAttested"] == 2, out
    rc, out = _run(capsys, "verify-handoff", "--json", str(forged), "--ca", ca)
    assert rc == EXIT_REJECTED and out["check"] == CHECK_HANDOFF_SIGNATURE, out
    rc, out = _run(
        capsys, "verify-handoff", "--json", str(good), "--ca", str(fleet["other"] / "ca.pem")
    )
    assert rc == EXIT_REJECTED and out["check"] == CHECK_HANDOFF_SIGNER, out


def test_coordinator_refuses_ready_without_a_valid_attestation_and_signs_its_events(
    fleet: dict[str, Any], tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    pki, ca = fleet["pki"], fleet["ca"]
    m = checkpoint["manifest"]
    c = Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "c.sqlite"), trusted_keys=TrustedKeys.load(checkpoint["trusted"])
        )
    )
    c.use_identity(_signer(pki, "coordinator"), TrustFile(pki / "ca.pem"))
    try:
        for h, r in HOSTS.items():
            c.enroll(h, r, {"cluster": "att"})
            c.heartbeat(h, r, "10.0.0.1:1", [])
        job = c.create_job(
            JobSpec(
                model=m.model,
                version=m.version,
                manifest_uri=str(checkpoint["envelope"]),
                target_selector="cluster=att",
                job_id="dj_att",
            )
        ).job_id
        full = bitmap_from_bits(bytearray([1]) * m.num_chunks)

        def ready(host: str, att: dict[str, Any] | None) -> None:
            c.report_progress(
                job,
                host,
                ProgressReport(
                    have=full,
                    ready=True,
                    placed_manifest_digest=m.digest,
                    placement_attestation=json.dumps(att) if att else "",
                ),
            )

        with pytest.raises(ReadyRefused, match=CHECK_ATTESTATION_MISSING):
            ready("h00", None)
        with pytest.raises(ReadyRefused, match=CHECK_ATTESTATION_SIGNER):
            ready("h00", _attest(pki, "h00", m.digest, signer_name="h01"))
        with pytest.raises(ReadyRefused, match=CHECK_ATTESTATION_DIGEST):
            ready("h00", _attest(pki, "h00", DIGEST))
        assert c.job_status(job).hosts_ready == 0
        for h in HOSTS:
            ready(h, _attest(pki, h, m.digest))
        c.tick()
        assert c.job_status(job).state == "DONE"
        (row,) = c.store.job_events(job)
        body = verify_event_bytes(row.body, ca)  # signed, every READY host attested
        assert body["type"] == "DistributionComplete" and body["readyHosts"] == sorted(HOSTS)
    finally:
        c.close()


def test_a_verifying_webhook_refuses_forged_and_unsigned_posts(fleet: dict[str, Any]) -> None:
    from agent_harness import Webhook

    pki = fleet["pki"]
    hook = Webhook(ca=pki / "ca.pem")
    event = _event(pki, {h: _attest(pki, h) for h in HOSTS})

    def post(doc: dict[str, Any]) -> int:
        req = urllib.request.Request(  # noqa: S310 - the test webhook on loopback
            hook.url, data=json.dumps(doc).encode(), method="POST", headers={}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - as above
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        unsigned = {k: v for k, v in event.items() if k != "signature"}
        assert post(unsigned) == 403
        assert post({**event, "readyHosts": ["h00"]}) == 403
        assert post(_event(fleet["other"], event["attestations"])) == 403
        assert hook.events == []
        assert hook.refused == [
            CHECK_HANDOFF_UNSIGNED,
            CHECK_HANDOFF_SIGNATURE,
            CHECK_HANDOFF_SIGNER,
        ]
        assert post(event) == 204 and len(hook.events) == 1
    finally:
        hook.close()


def test_malformed_or_out_of_validity_attestations_and_events_are_named(
    fleet: dict[str, Any],
) -> None:
    """From a mutation run: each malformed shape and the certificate's validity window."""
    pki, ca = fleet["pki"], fleet["ca"]
    good = {h: _attest(pki, h) for h in HOSTS}

    def with_h00(att: dict[str, Any]) -> str:
        return _refused(_event(pki, {**good, "h00": att}), ca)

    def payload(raw: bytes) -> dict[str, Any]:
        return {**good["h00"], "payload": base64.b64encode(raw).decode()}

    assert with_h00({**good["h00"], "payloadType": "text/plain"}) == CHECK_ATTESTATION_MALFORMED
    assert with_h00(payload(b"not json")) == CHECK_ATTESTATION_MALFORMED
    doc = json.loads(base64.b64decode(good["h00"]["payload"]))
    spaced = json.dumps(doc, indent=1).encode()  # the same fields, not canonical
    assert with_h00(payload(spaced)) == CHECK_ATTESTATION_MALFORMED
    # signed while the host's certificate was valid, to the millisecond of its start
    cert = x509.load_pem_x509_certificate(good["h00"]["certificate"].encode())
    start_ms = int(cert.not_valid_before_utc.timestamp() * 1000)
    end_ms = int(cert.not_valid_after_utc.timestamp() * 1000)

    def at(ms: int) -> dict[str, Any]:
        att = sign_placement(
            _signer(pki, "h00"),
            host_id="h00",
            model="claude-x",
            version="v1",
            manifest_digest=DIGEST,
            path="/models/claude-x/v1",
            placed_at_ms=ms,
        )
        return att

    assert verify_event(_event(pki, {**good, "h00": at(start_ms)}), ca)
    assert verify_event(_event(pki, {**good, "h00": at(end_ms)}), ca)
    assert with_h00(at(start_ms - 1)) == CHECK_ATTESTATION_SIGNER
    assert with_h00(at(end_ms + 1000)) == CHECK_ATTESTATION_SIGNER
    # events: not a list of hosts; a field no canonical JSON can hold (signed over before)
    event = _event(pki, good)
    now = int(time.time() * 1000)
    odd = sign_event(_signer(pki, "coordinator"), {**event, "readyHosts": "h00"}, now)
    assert _refused(odd, ca) == CHECK_HANDOFF_MALFORMED
    assert _refused({**event, "hostsTotal": 2**60}, ca) == CHECK_HANDOFF_MALFORMED
