"""The demo's deployer webhook verifies the handoff: the coordinator's signature and every
READY host's placement attestation against the fleet CA; forged and unsigned POSTs get 403."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from relgate.checkpoint.local_fleet import WebhookSink
from relgate_agent.attestation import (
    CHECK_HANDOFF_SIGNATURE,
    CHECK_HANDOFF_UNSIGNED,
    CertSigner,
    sign_event,
    sign_placement,
)
from relgate_agent.pki import TlsFiles, ensure_dev_pki

DIGEST = "sha256:" + "d" * 64


def _post(url: str, doc: object) -> int:
    req = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST")  # noqa: S310 - loopback sink
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback sink
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_sink_accepts_a_signed_attested_event_and_refuses_forged_or_unsigned(
    tmp_path: Path,
) -> None:
    pki = ensure_dev_pki(tmp_path, {"host-00": "rack-0"})
    now = int(time.time() * 1000)
    att = sign_placement(
        CertSigner.from_tls(TlsFiles.from_pki(pki, "host-00")),
        host_id="host-00",
        model="m",
        version="v",
        manifest_digest=DIGEST,
        path="/models/m/v",
        placed_at_ms=now,
    )
    event = sign_event(
        CertSigner.from_tls(TlsFiles.from_pki(pki, "coordinator")),
        {
            "type": "DistributionComplete",
            "job": "dj_1",
            "manifestDigest": DIGEST,
            "readyHosts": ["host-00"],
            "attestations": {"host-00": att},
        },
        now,
    )
    sink = WebhookSink(ca=pki / "ca.pem")
    try:
        assert _post(sink.url, {k: v for k, v in event.items() if k != "signature"}) == 403
        assert _post(sink.url, {**event, "manifestDigest": "sha256:" + "e" * 64}) == 403
        assert sink.events == [] and sink.refused == [
            CHECK_HANDOFF_UNSIGNED,
            CHECK_HANDOFF_SIGNATURE,
        ]
        assert _post(sink.url, event) == 204
        assert sink.first_event(1.0) == json.loads(json.dumps(event))
    finally:
        sink.close()
