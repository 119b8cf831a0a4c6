"""Jobs end, with their reason: "already holds it" is judged by the manifest digest (two
validly signed manifests for one model/version), and a removed target stays removed."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from agent_harness import HOSTS, Cluster, assert_placed
from relgate_trust.dsse import REVOKED_FILE, keyid_of, revoked_bytes
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import (
    CheckpointManifest,
    TrustedKeys,
    build_manifest,
    sign_manifest,
    write_envelope,
)
from test_distribution import create_job, start_hosts

from relgate_agent.contracts import ProgressReport
from relgate_agent.coordinator.jobstate import REMOVED, ReadyRefused
from relgate_agent.coordinator.removal import remove_host
from relgate_agent.coordinator.service import Coordinator, CoordinatorConfig
from relgate_agent.staging.storage import bitmap_from_bits

MODEL, VERSION = "claude-x", "2026-10-12.3"


def _second_manifest(tmp_path: Path, checkpoint: dict[str, Any], key: Any) -> tuple[Path, Path]:
    """Another validly signed manifest for the same model/version over different bytes."""
    src = tmp_path / "origin2" / "ckpt"
    shutil.copytree(checkpoint["origin"], src)
    victim = src / checkpoint["manifest"].files[0].path
    data = bytearray(victim.read_bytes())
    data[0] ^= 0xFF
    victim.write_bytes(bytes(data))
    m = build_manifest(src, MODEL, VERSION, chunk_size=1 << 20, block_size=64 << 10)
    env = tmp_path / "origin2" / "manifest.dsse.json"
    write_envelope(sign_manifest(m, key), env)
    assert m.digest != checkpoint["manifest"].digest
    return env, src


def _ready(c: Coordinator, job_id: str, host: str, m: CheckpointManifest, placed: str) -> None:
    full = bitmap_from_bits(bytearray([1]) * m.num_chunks)
    c.report_progress(
        job_id, host, ProgressReport(have=full, ready=True, placed_manifest_digest=placed)
    )


def test_a_second_digest_for_one_version_is_never_taken_as_held(
    tmp_path: Path, checkpoint: dict[str, Any], keypair: Any
) -> None:
    key = keypair[0]
    first = checkpoint["manifest"]
    env2, _ = _second_manifest(tmp_path, checkpoint, key)
    c = Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "c.sqlite"), trusted_keys=TrustedKeys.load(checkpoint["trusted"])
        )
    )
    try:
        for h in ("h0", "h1"):
            c.enroll(h, "r0", {"cluster": "d"})
            c.heartbeat(h, "r0", f"10.0.0.{h[1]}:1", [])

        def spec(uri: Path, job_id: str) -> JobSpec:
            return JobSpec(
                model=MODEL,
                version=VERSION,
                manifest_uri=str(uri),
                target_selector="cluster=d",
                job_id=job_id,
            )

        a = c.create_job(spec(checkpoint["envelope"], "dj_first")).job_id
        for h in ("h0", "h1"):
            _ready(c, a, h, first, first.digest)
        c.tick()
        assert c.job_status(a).state == "DONE"
        for h in ("h0", "h1"):  # both hosts hold the first digest's bytes under the version
            c.heartbeat(h, "r0", f"10.0.0.{h[1]}:1", [f"{MODEL}/{VERSION}"])
        b = c.create_job(spec(env2, "dj_second"))
        # not "already held": same model/version, another digest
        assert b.ready == set() and set(b.topology.racks) == {"h0", "h1"}
        second = b.manifest
        for h in ("h0", "h1"):  # a READY for the first digest is refused for the second
            with pytest.raises(ReadyRefused, match="placed digest"):
                _ready(c, b.job_id, h, second, first.digest)
        c.tick()
        report = c.job_status(b.job_id)
        assert report.state == "DISTRIBUTING" and report.hosts_ready == 0
        # the first digest is still held: a third job for it skips both hosts
        again = c.create_job(spec(checkpoint["envelope"], "dj_first_again"))
        assert again.ready == {"h0", "h1"}
    finally:
        c.close()


def test_agents_holding_the_first_digest_never_report_the_second_placed(
    cluster: Cluster, checkpoint: dict[str, Any], keypair: Any, tmp_path: Path
) -> None:
    """Real agents: the first manifest placed on both; the second (other bytes, same
    model/version) is refused by each host (PLACED_MISMATCH, naming both digests) and the
    job FAILED; the first copy is untouched."""
    first = checkpoint["manifest"]
    env2, src2 = _second_manifest(tmp_path, checkpoint, keypair[0])
    cluster.start_coordinator()
    start_hosts(cluster, HOSTS[:2])
    a = create_job(cluster, checkpoint)
    cluster.wait_for(lambda: cluster.status(a)["state"] == "DONE", 60, "the first job DONE")
    b = create_job(cluster, checkpoint, manifest_uri=str(env2), origin_uri=str(src2))
    st = cluster.wait_for(
        lambda: (r := cluster.status(b))["state"] == "FAILED" and r, 60, "the second FAILED"
    )
    assert st["hosts_ready"] == 0
    assert "PLACED_MISMATCH" in st["error"] and first.digest in st["error"], st["error"]
    for h, _ in HOSTS[:2]:
        assert_placed(cluster, checkpoint, h)  # still the first digest's bytes


def test_a_removed_target_stays_removed_after_a_restart(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    db = str(tmp_path / "c.sqlite")
    cfg = CoordinatorConfig(db=db, trusted_keys=TrustedKeys.load(checkpoint["trusted"]))
    c = Coordinator(cfg)
    m = checkpoint["manifest"]
    for h in ("h0", "h1", "h2"):
        c.enroll(h, f"r{h[1]}", {"cluster": "d"})
        c.heartbeat(h, f"r{h[1]}", f"10.0.0.{h[1]}:1", [])
    job = c.create_job(
        JobSpec(
            model=MODEL,
            version=VERSION,
            manifest_uri=str(checkpoint["envelope"]),
            target_selector="cluster=d",
            job_id="dj_rm",
        )
    )
    with c.lock:
        v = job.topology.version
        assert remove_host(c, job, "h1", "NO_SPACE need 1 bytes, 0 free")
        assert not remove_host(c, job, "h1", "again")  # once
    assert "h1" not in job.topology.racks and job.topology.version > v
    c.close()
    again = Coordinator(cfg)
    try:
        live = again.jobs["dj_rm"]
        assert live.removed == {"h1": "NO_SPACE need 1 bytes, 0 free"}
        assert live.hosts["h1"].state == REMOVED and live.eligible == {"h0", "h2"}
        with pytest.raises(Exception, match="removed from job dj_rm: NO_SPACE"):
            again.register("dj_rm", "h1", "r1", b"", 0, "10.0.0.1:1")
        for h in ("h0", "h2"):
            _ready(again, "dj_rm", h, m, m.digest)
        again.tick()
        assert again.job_status("dj_rm").state == "DONE"  # without the removed host
    finally:
        again.close()


def test_a_manifest_signed_by_a_key_the_agents_revoked_fails_the_job_at_once(
    tmp_path: Path, checkpoint: dict[str, Any], keypair: Any
) -> None:
    """The coordinator still trusts the signer; every agent's trust set revokes it: each
    host refuses (check key-revoked), and the job FAILED naming the check, not
    DISTRIBUTING for ever."""
    revoking = tmp_path / "agent-trusted"
    revoking.mkdir()
    shutil.copy(Path(checkpoint["trusted"]) / "builder-v1.pem", revoking / "builder-v1.pem")
    (revoking / REVOKED_FILE).write_bytes(revoked_bytes([keyid_of(keypair[0].public_key())]))
    cluster = Cluster(tmp_path / "cluster", checkpoint["trusted"], ["--report-interval", "0.5"])
    cluster.agent_trusted = revoking
    try:
        cluster.start_coordinator()
        start_hosts(cluster, HOSTS[:2])
        job = create_job(cluster, checkpoint)
        st = cluster.wait_for(
            lambda: (r := cluster.status(job))["state"] == "FAILED" and r, 60, "FAILED"
        )
        for h, _ in HOSTS[:2]:
            assert f"{h}: HOST_FAILED" in st["error"], st["error"]
        assert st["error"].count("MANIFEST_REJECTED check=key-revoked") == 2, st["error"]
        assert st["bytes_moved"] == 0
    finally:
        cluster.stop_all()
