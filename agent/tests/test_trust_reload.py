"""Trusted keys and their revocation list reloaded by running daemons (identity/trustwatch.py):
a key revoked by editing ``revoked.json`` is refused by the coordinator and agents already
running; a broken or vanished list keeps the previous revocations in force."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
from agent_harness import Cluster, assert_placed, job_spec
from relgate_trust.dsse import REVOKED_FILE, TrustedKeys, keyid_of, revoked_bytes
from relgate_trust.manifest import (
    generate_private_key,
    sign_manifest,
    write_envelope,
    write_keypair,
)

from relgate_agent.client import CoordinatorRefusal
from relgate_agent.identity.trustwatch import CHECK_REVOCATIONS_GONE, TrustWatch

WAIT_S = 30  # bounded waits: a poll is every 2 s


def _bump(path: Path, data: bytes) -> None:
    """Rewrite ``path`` so its stat surely changes (size or inode) even within one mtime tick."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _second_key(tmp_path: Path, checkpoint: dict[str, Any]) -> tuple[str, Path]:
    """A second trusted builder key; the checkpoint's manifest signed by it."""
    key = generate_private_key()
    keys = tmp_path / "keys2"
    keys.mkdir()
    write_keypair(key, keys / "signer.key", keys / "builder-v1.pem")
    os.link(keys / "builder-v1.pem", checkpoint["trusted"] / "builder-v1-second.pem")
    envelope = tmp_path / "origin" / "manifest-second.dsse.json"
    write_envelope(sign_manifest(checkpoint["manifest"], key), envelope)
    return keyid_of(key.public_key()), envelope


def _first_keyid(checkpoint: dict[str, Any]) -> str:
    keys = TrustedKeys.load([str(checkpoint["trusted"] / "builder-v1.pem")])
    return next(iter(keys.keys))


def _create(cluster: Cluster, job_id: str, envelope: Path, checkpoint: dict[str, Any]) -> Any:
    c = cluster.client()
    try:
        return c.create_job(job_id=job_id, **job_spec(checkpoint, manifest_uri=str(envelope)))
    finally:
        c.close()


_PROBES = iter(range(1_000_000))


def _refused_check(
    cluster: Cluster, job_id: str, envelope: Path, checkpoint: dict[str, Any]
) -> str:
    try:
        _create(cluster, f"{job_id}-{next(_PROBES)}", envelope, checkpoint)  # ids are idempotent
    except CoordinatorRefusal as exc:
        return exc.check
    return ""


def _logged(path: Path, text: str) -> bool:
    return text in path.read_text(errors="replace")


def test_revoking_a_key_while_running(
    tmp_path: Path, cluster: Cluster, checkpoint: dict[str, Any]
) -> None:
    second_keyid, second_envelope = _second_key(tmp_path, checkpoint)
    first_keyid = _first_keyid(checkpoint)
    revoked = checkpoint["trusted"] / REVOKED_FILE
    cluster.start_coordinator()
    cluster.start_agent("h00", "r0")
    cluster.wait_registered(1)
    logs = cluster.base / "logs"

    # revoke the first key by editing the list while both run: no restart
    _bump(revoked, revoked_bytes([first_keyid]))
    what = "the coordinator to refuse the revoked key"
    cluster.wait_for(
        lambda: (
            _refused_check(cluster, "probe", checkpoint["envelope"], checkpoint) == "key-revoked"
        ),
        WAIT_S,
        what,
        interval=0.5,
    )
    cluster.wait_for(
        lambda: _logged(logs / "h00.log", "trusted keys reloaded"), WAIT_S, "h00 reload"
    )
    for name in ("coordinator", "h00"):
        assert cluster.procs[name].poll() is None, f"{name} restarted or died"

    # a manifest signed by a key still trusted is admitted and placed by the same agent
    assert second_keyid != first_keyid
    job_id = cluster.create_full_job(
        1, "second-key", **job_spec(checkpoint, manifest_uri=str(second_envelope))
    )
    cluster.wait_for(lambda: cluster.status(job_id)["state"] == "DONE", 60, "the second-key job")
    assert_placed(cluster, checkpoint, "h00")

    # a corrupt revocation list is refused: the revocation stays in force
    _bump(revoked, b'{"schema": broken')
    cluster.wait_for(
        lambda: _logged(logs / "coordinator.log", f"{revoked} refused (check=payload-json)"),
        WAIT_S,
        "the coordinator to refuse the corrupt list",
    )
    cluster.wait_for(lambda: _logged(logs / "h00.log", "check=payload-json"), WAIT_S, "h00 refusal")
    assert (
        _refused_check(cluster, "after-corrupt", checkpoint["envelope"], checkpoint)
        == "key-revoked"
    )

    # so is a list that vanished
    revoked.unlink()
    cluster.wait_for(
        lambda: _logged(logs / "coordinator.log", f"check={CHECK_REVOCATIONS_GONE}"),
        WAIT_S,
        "the coordinator to refuse the vanished list",
    )
    assert (
        _refused_check(cluster, "after-gone", checkpoint["envelope"], checkpoint) == "key-revoked"
    )
    for name in ("coordinator", "h00"):
        assert cluster.procs[name].poll() is None, f"{name} restarted or died"


# ------------------------------------------------------------------ the watch on its own


def test_watch_swaps_only_good_sets(
    tmp_path: Path, checkpoint: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    trusted = checkpoint["trusted"]
    first = _first_keyid(checkpoint)
    watch = TrustWatch([str(trusted)], poll_s=0)
    applied: list[TrustedKeys] = []
    watch.start(applied.append)
    assert not watch.poll() and watch.keys.revoked == frozenset()

    _bump(trusted / REVOKED_FILE, revoked_bytes([first]))
    assert watch.poll() and applied[-1].revoked == {first}

    caplog.set_level(logging.ERROR, logger="relgate_agent.identity.trustwatch")
    _bump(trusted / REVOKED_FILE, b"not json")
    assert not watch.poll() and watch.keys.revoked == {first} and len(applied) == 1
    assert f"{trusted / REVOKED_FILE} refused (check=payload-json)" in caplog.text

    _bump(trusted / REVOKED_FILE, revoked_bytes([first]))
    _bump(trusted / "builder-v1.pem", b"-----BEGIN nothing")
    assert not watch.poll() and "check=trusted-keys" in caplog.text

    (trusted / REVOKED_FILE).unlink()
    _bump(trusted / "builder-v1.pem", (tmp_path / "keys" / "builder-v1.pem").read_bytes())
    assert not watch.poll() and f"check={CHECK_REVOCATIONS_GONE}" in caplog.text
    assert watch.keys.revoked == {first} and len(applied) == 1

    assert (watch.reloads, watch.refusals) == (1, 3)  # one swap, three refused sets

    # an explicit, valid list lifts the revocation, and says so
    caplog.set_level(logging.WARNING, logger="relgate_agent.identity.trustwatch")
    _bump(trusted / REVOKED_FILE, revoked_bytes([]))
    assert watch.poll() and applied[-1].revoked == frozenset()
    assert f"revocation lifted for {first}" in caplog.text
    assert (watch.reloads, watch.refusals) == (2, 3)
    watch.stop()
