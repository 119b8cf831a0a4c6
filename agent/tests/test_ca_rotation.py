"""CA rotation (docs/agent-ca-rotation.md): two CAs trusted during an overlap.

The CA directory's steps refuse out of order and recover from a crash between writes; a
served bundle is hostile until parsed (hypothesis); and a fleet rotates mid-job with bytes
flowing: hosts (each with its own PKI directory) learn the bundle from the coordinator,
renew onto the promoted CA, drop the retired one, the job ends DONE byte-exact without a
restart, and a certificate of the retired CA is refused on its next call (``cert-issuer``).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_harness import Cluster, assert_placed, job_spec
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from relgate_agent.cli import main as cli_main
from relgate_agent.client import CoordinatorClient, sent_check
from relgate_agent.identity import carotation
from relgate_agent.identity.cabundle import (
    CHECK_CERT_ISSUER,
    CHECK_TRUST_BUNDLE,
    CHECK_TRUST_CONTINUITY,
    CHECK_TRUST_ORPHAN,
    BundleRefused,
    CaBundle,
    TrustFile,
    continues,
    fingerprint,
    issued_by,
)
from relgate_agent.identity.carotation import CA_NEXT_KEY, CHECK_CA_ROTATION
from relgate_agent.pki import CA_CERT, CA_KEY, PkiError, TlsFiles, ca_init, issue, load_signer

WAIT_S = 90
HOSTS = {"h1": "r1", "h2": "r1"}


def _cas(path: Path) -> list[str]:
    return [fingerprint(c) for c in x509.load_pem_x509_certificates(path.read_bytes())]


def _issuer(cert: Path, ca_dir: Path) -> str:
    """The fingerprint of the CA (of ``ca_dir``'s bundle) that signed ``cert``."""
    found = CaBundle.parse((ca_dir / CA_CERT).read_bytes()).issuer_of(
        x509.load_pem_x509_certificate(cert.read_bytes())
    )
    return fingerprint(found) if found is not None else ""


# ---------------------------------------------------------------- the CA directory's steps


def test_the_steps_go_in_order_and_the_signer_follows(tmp_path: Path) -> None:
    ca_init(tmp_path)
    old = carotation.state(tmp_path)
    assert (old.step, old.pending, old.trusted) == ("single", "", (old.signer,))
    with pytest.raises(PkiError) as no_promote:
        carotation.promote(tmp_path)
    with pytest.raises(PkiError) as no_retire:
        carotation.retire(tmp_path)
    assert no_promote.value.check == no_retire.value.check == CHECK_CA_ROTATION

    rotated = carotation.rotate(tmp_path)
    assert rotated.step == "rotated" and rotated.signer == old.signer
    assert rotated.trusted == (old.signer, rotated.pending)
    assert (tmp_path / CA_NEXT_KEY).stat().st_mode & 0o777 == 0o600
    cert, _ = issue(tmp_path, "operator")  # the old CA still signs
    assert _issuer(cert, tmp_path) == old.signer
    with pytest.raises(PkiError) as twice:
        carotation.rotate(tmp_path)
    assert twice.value.check == CHECK_CA_ROTATION

    promoted = carotation.promote(tmp_path)
    assert promoted.step == "overlap" and promoted.signer == rotated.pending
    assert promoted.trusted == (rotated.pending, old.signer)  # the signer leads the bundle
    assert not (tmp_path / CA_NEXT_KEY).exists()
    assert (tmp_path / CA_KEY).stat().st_mode & 0o777 == 0o600
    cert, _ = issue(tmp_path, "operator")
    assert _issuer(cert, tmp_path) == promoted.signer
    with pytest.raises(PkiError) as overlap:
        carotation.rotate(tmp_path)  # retire first: never three CAs
    assert overlap.value.check == CHECK_CA_ROTATION

    retired = carotation.retire(tmp_path)
    assert (retired.step, retired.trusted) == ("single", (promoted.signer,))
    assert _cas(tmp_path / CA_CERT) == [promoted.signer]
    assert (tmp_path / CA_CERT).stat().st_mode & 0o777 == 0o644


def test_the_bundle_file_is_world_readable_after_each_step(tmp_path: Path) -> None:
    ca_init(tmp_path)
    for step in (carotation.rotate, carotation.promote):
        step(tmp_path)
        assert (tmp_path / CA_CERT).stat().st_mode & 0o777 == 0o644


def test_a_next_key_without_its_certificate_is_refused(tmp_path: Path) -> None:
    ca_init(tmp_path)
    carotation.rotate(tmp_path)
    (tmp_path / CA_CERT).write_bytes(_pem(load_signer(tmp_path)[1]))  # the new CA dropped
    for step in (carotation.state, carotation.promote):
        with pytest.raises(PkiError) as refused:
            step(tmp_path)
        assert refused.value.check == "ca-unusable"
        assert str(tmp_path / CA_CERT) in str(refused.value)


def test_the_trust_file_follows_changes_and_keeps_the_last_good_bundle(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / CA_CERT
    with pytest.raises(BundleRefused):
        TrustFile(path, recheck_s=0).bundle()  # never read: refused
    one, two = _pem(_ca()), _pem(_ca(), _ca())
    path.write_bytes(one)
    trust = TrustFile(path, recheck_s=0)  # every read looks (the default: once a second)
    assert trust.pem() == one and len(trust.bundle().cas) == 1
    path.write_bytes(two)
    assert trust.pem() == two and len(trust.bundle().cas) == 2
    path.write_bytes(b"not a bundle")
    assert trust.pem() == two  # the last good one, and said so
    assert "keeping the previous bundle" in caplog.text
    path.write_bytes(one)
    assert trust.pem() == one  # looked at again


def test_the_trust_file_looks_again_only_once_its_interval_has_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within ``recheck_s`` of its last look the bundle is answered from memory (no stat per
    call); from the interval on, a changed file is read."""
    from types import SimpleNamespace

    from relgate_agent.identity import cabundle

    now = [1000.0]
    monkeypatch.setattr(cabundle, "time", SimpleNamespace(monotonic=lambda: now[0]))
    path = tmp_path / CA_CERT
    one, two = _pem(_ca()), _pem(_ca(), _ca())
    path.write_bytes(one)
    trust = TrustFile(path, recheck_s=1.0)
    assert trust.pem() == one
    path.write_bytes(two)
    for now[0], seen in ((1000.5, one), (1000.999, one), (1001.0, two)):
        assert trust.pem() == seen, now[0]
    path.write_bytes(one)
    now[0] = 2002.5  # long after: looked at again (the interval is a difference of times)
    assert trust.pem() == one


def test_the_size_bound_is_exact() -> None:
    from relgate_agent.identity.cabundle import MAX_BUNDLE_BYTES

    assert MAX_BUNDLE_BYTES == 64 * 1024  # the bound docs/agent-ca-rotation.md states
    pem = _pem(_ca())
    at = pem + b"#" * (MAX_BUNDLE_BYTES - len(pem))  # text the PEM reader skips
    assert len(CaBundle.parse(at).cas) == 1
    for bad in (at + b"#", b""):
        with pytest.raises(BundleRefused, match=rf"is 1\.\.{MAX_BUNDLE_BYTES} bytes"):
            CaBundle.parse(bad)


def test_a_ca_is_trusted_from_its_first_to_its_last_instant() -> None:
    ca = _ca()
    pem, second = _pem(ca), dt.timedelta(seconds=1)
    for when in (ca.not_valid_before_utc, ca.not_valid_after_utc):
        assert CaBundle.parse(pem, now=when).signer == ca
    for when in (ca.not_valid_before_utc - second, ca.not_valid_after_utc + second):
        with pytest.raises(BundleRefused, match="outside its validity"):
            CaBundle.parse(pem, now=when)


def test_a_promote_cut_short_completes_when_run_again(tmp_path: Path) -> None:
    ca_init(tmp_path)
    rotated = carotation.rotate(tmp_path)
    # the crash: promote wrote the reordered bundle, not yet the key
    bundle = CaBundle.parse((tmp_path / CA_CERT).read_bytes())
    (tmp_path / CA_CERT).write_bytes(CaBundle((bundle.cas[1], bundle.cas[0])).pem())
    _, signer = load_signer(tmp_path)  # the old key still signs, with its own certificate
    assert fingerprint(signer) == rotated.signer
    assert carotation.state(tmp_path).step == "rotated"
    again = carotation.promote(tmp_path)
    assert again.signer == rotated.pending and again.step == "overlap"


def test_the_cli_walks_a_rotation_and_refuses_with_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(*args: str) -> tuple[int, str]:
        code = cli_main([*args, "--dir", str(tmp_path), "--json"])
        return code, capsys.readouterr().out

    assert run("ca", "init")[0] == 0
    code, out = run("ca", "retire")
    assert code == 3 and CHECK_CA_ROTATION in out
    for step, want in (("rotate", "rotated"), ("promote", "overlap"), ("retire", "single")):
        code, out = run("ca", step)
        assert code == 0, out
        assert json.loads(out)["step"] == want
    assert json.loads(run("ca", "status")[1])["step"] == "single"


# ---------------------------------------------------------------- a bundle is hostile


def _ca(
    days: float = 30, ca: bool = True, start_days: float = -1, *, cert_sign: bool | None = None
) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    now = dt.datetime.now(dt.UTC)
    sign = ca if cert_sign is None else cert_sign
    usage = x509.KeyUsage(False, False, False, False, False, sign, sign, False, False)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + dt.timedelta(days=start_days))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )


def _pem(*certs: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


@pytest.mark.parametrize(
    "bundle",
    [
        pytest.param(lambda: b"", id="empty"),
        pytest.param(
            lambda: b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", id="garbage"
        ),
        pytest.param(lambda: _pem(_ca(ca=False)), id="not-a-ca"),
        pytest.param(lambda: _pem(_ca(cert_sign=False)), id="ca-that-may-not-sign"),
        pytest.param(lambda: _pem(_ca(ca=False, cert_sign=True)), id="signer-not-a-ca"),
        pytest.param(lambda: _pem(_ca(days=-1, start_days=-2)), id="expired"),
        pytest.param(lambda: _pem(_ca(start_days=1, days=2)), id="not-yet-valid"),
        pytest.param(lambda: _pem(*(_ca(),) * 2), id="duplicate"),
        pytest.param(lambda: _pem(*[_ca() for _ in range(5)]), id="five-cas"),
        # a good CA padded past 64 KiB with text the PEM reader skips
        pytest.param(lambda: _pem(_ca()) + b"#" * (64 * 1024), id="oversized"),
    ],
)
def test_a_bundle_that_is_no_set_of_fleet_cas_is_refused(bundle: Any) -> None:
    with pytest.raises(BundleRefused) as refused:
        CaBundle.parse(bundle())
    assert refused.value.check == CHECK_TRUST_BUNDLE


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096) | st.text(max_size=2048).map(str.encode))
def test_any_bytes_parse_or_refuse_with_the_check(raw: bytes) -> None:
    framed = b"-----BEGIN CERTIFICATE-----\n" + raw + b"\n-----END CERTIFICATE-----\n"
    for candidate in (raw, framed):
        try:
            CaBundle.parse(candidate)
        except BundleRefused as exc:
            assert exc.check == CHECK_TRUST_BUNDLE


def test_a_served_bundle_must_continue_the_trusted_one(tmp_path: Path) -> None:
    ca_init(tmp_path)
    cert, _ = issue(tmp_path, "host", host_id="h1", rack="r1")
    own = x509.load_pem_x509_certificate(cert.read_bytes())
    current = CaBundle.parse((tmp_path / CA_CERT).read_bytes())
    stranger = CaBundle((_ca(),))
    with pytest.raises(BundleRefused) as other_fleet:
        continues(current, stranger, own)
    assert other_fleet.value.check == CHECK_TRUST_CONTINUITY
    carotation.rotate(tmp_path)
    carotation.promote(tmp_path)
    new_only = CaBundle((load_signer(tmp_path)[1],))
    with pytest.raises(BundleRefused) as orphan:
        continues(CaBundle.parse((tmp_path / CA_CERT).read_bytes()), new_only, own)
    assert orphan.value.check == CHECK_TRUST_ORPHAN
    continues(current, CaBundle.parse((tmp_path / CA_CERT).read_bytes()), own)  # the overlap


# ---------------------------------------------------------------- a fleet rotates mid-job


def _own_pki(cluster: Cluster, host: str) -> Path:
    """A host's own PKI directory (its bundle, certificate and key), as on a real host."""
    d = cluster.base / "hostpki" / host
    d.mkdir(parents=True)
    for name in (CA_CERT, f"{host}.pem", f"{host}.key"):
        shutil.copy2(cluster.pki / name, d / name)
    return d


def _tls_args(d: Path, host: str) -> list[str]:
    return [
        "--ca",
        str(d / CA_CERT),
        "--cert",
        str(d / f"{host}.pem"),
        "--key",
        str(d / f"{host}.key"),
    ]


def test_a_fleet_rotates_its_ca_while_a_job_runs(
    cluster: Cluster, checkpoint: dict[str, Any]
) -> None:
    cluster.enrolled.update({h: (r, "cluster=inf-a") for h, r in HOSTS.items()})
    pki = cluster.pki
    own = {h: _own_pki(cluster, h) for h in HOSTS}
    old_operator = cluster.base / "old-operator"
    old_operator.mkdir()
    for name in (CA_CERT, "operator.pem", "operator.key"):
        shutil.copy2(pki / name, old_operator / name)
    cluster.start_coordinator(extra=["--ca-dir", str(pki)])
    for h, r in HOSTS.items():
        extra = [*_tls_args(own[h], h), "--trust-poll", "0.3", "--renew-before", "1"]
        cluster.start_agent(h, r, extra_args=extra)
    pids = {h: cluster.agents[h]["pid"] for h in HOSTS}
    # the origin at 1 MiB/s: the 24 MiB take ~24 s, the rotation happens while they flow
    spec = job_spec(checkpoint, origin_cap_bytes_per_s=1 << 20)
    job_id = cluster.create_full_job(len(HOSTS), "rotate-1", **spec)
    cluster.wait_for(
        lambda: any(cluster.journaled(h, checkpoint["manifest"]) > 0 for h in HOSTS),
        WAIT_S,
        "bytes flowing",
    )
    stale = CoordinatorClient(cluster.coordinator, TlsFiles.from_pki(old_operator, "operator"))
    try:
        stale.get_job(job_id, timeout=10)  # its connection opens under the old CA

        rotated = carotation.rotate(pki)
        for h in HOSTS:  # every host learns the new CA from the coordinator
            cluster.wait_for(lambda h=h: len(_cas(own[h] / CA_CERT)) == 2, WAIT_S, f"{h} bundle")
        promoted = carotation.promote(pki)
        assert promoted.signer == rotated.pending
        issue(pki, "coordinator")  # reloaded by the coordinator at its next handshake
        issue(pki, "operator")
        for h in HOSTS:  # the signer changed: each host renews onto the new CA
            cluster.wait_for(
                lambda h=h: _issuer(own[h] / f"{h}.pem", pki) == promoted.signer,
                WAIT_S,
                f"{h} renewed onto the new CA",
            )
        carotation.retire(pki)
        for h in HOSTS:
            cluster.wait_for(
                lambda h=h: _cas(own[h] / CA_CERT) == [promoted.signer], WAIT_S, f"{h} retired"
            )
        with pytest.raises(grpc.RpcError) as refused:
            stale.get_job(job_id, timeout=10)  # the open connection: refused on this call
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert sent_check(refused.value) == CHECK_CERT_ISSUER
        # still mid-job: the rotation happened while the bytes flowed
        assert cluster.status(job_id)["state"] != "DONE"
    finally:
        stale.close()

    cluster.wait_for(
        lambda: cluster.status(job_id)["state"] == "DONE", WAIT_S, f"{job_id} DONE", interval=0.5
    )
    for h in HOSTS:
        assert_placed(cluster, checkpoint, h)
        assert cluster.procs[h].poll() is None and cluster.procs[h].pid == pids[h]
        log = (cluster.base / "logs" / f"{h}.log").read_text(errors="replace")
        assert log.count("trust bundle installed") == 3  # rotate, promote, retire
        assert "certificate renewed" in log
    status = cluster.status(job_id)
    assert sorted(h["host_id"] for h in status["hosts"] if h["state"] == "READY") == sorted(
        HOSTS
    ), status
    # a new connection with the retired CA's certificate does not get through the handshake
    fresh = CoordinatorClient(cluster.coordinator, TlsFiles.from_pki(old_operator, "operator"))
    try:
        with pytest.raises(grpc.RpcError) as handshake:
            fresh.get_job(job_id, timeout=5)
        assert handshake.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        fresh.close()


def test_the_signer_leads_and_issued_by_names_the_bundle_that_signed(tmp_path: Path) -> None:
    ca_init(tmp_path)
    cert, _ = issue(tmp_path, "host", host_id="h1", rack="r1")
    pem = cert.read_bytes()
    ours = CaBundle.parse((tmp_path / CA_CERT).read_bytes())
    other = _ca()
    assert CaBundle((ours.signer, other)).signer is ours.signer
    assert CaBundle((other, ours.signer)).signer is other
    assert issued_by(pem, ours) and issued_by(pem, CaBundle((other, ours.signer)))
    assert not issued_by(pem, CaBundle((other,)))
    assert not issued_by(b"not a certificate", ours)


def test_four_cas_are_a_bundle_five_are_not() -> None:
    four = [_ca() for _ in range(4)]
    assert len(CaBundle.parse(_pem(*four)).cas) == 4
    with pytest.raises(BundleRefused):
        CaBundle.parse(_pem(*four, _ca()))


def test_retire_keeps_exactly_the_signer_whatever_the_fingerprints(tmp_path: Path) -> None:
    ca_init(tmp_path)
    for _ in range(6):  # fingerprints fall either side of the signer's
        carotation.rotate(tmp_path)
        signer = carotation.promote(tmp_path).signer
        assert carotation.retire(tmp_path).trusted == (signer,)
        assert _cas(tmp_path / CA_CERT) == [signer]
