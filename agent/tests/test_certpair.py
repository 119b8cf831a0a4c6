"""A renewed key and certificate replace the live pair through staged files, and a crash
between the renames is finished (or undone) when the agent starts (identity/certpair.py).

The crash states are made on disk exactly as an interrupted install leaves them; the last
test starts a real agent on such a directory: without the recovery its key would not match
its certificate and it could not start."""

from __future__ import annotations

import shutil
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
from agent_harness import Cluster

from relgate_agent.agent.renew import serial_of
from relgate_agent.identity import certpair
from relgate_agent.pki import TlsFiles, ca_init, data_client_context, issue


@pytest.fixture
def pair(tmp_path: Path) -> dict[str, Any]:
    """A host's live pair in ``live/`` and a newer pair for it in ``new/``."""
    ca_init(tmp_path / "ca")
    issue(tmp_path / "ca", "host", host_id="h1", rack="r1", out_dir=tmp_path / "live")
    issue(tmp_path / "ca", "host", host_id="h1", rack="r1", out_dir=tmp_path / "new")
    tls = TlsFiles.from_pki(tmp_path / "live", "h1")
    new = TlsFiles.from_pki(tmp_path / "new", "h1")
    return {"tls": tls, "key": new.key.read_bytes(), "cert": new.cert.read_bytes()}


def _live(tls: TlsFiles) -> tuple[bytes, bytes]:
    return tls.key.read_bytes(), tls.cert.read_bytes()


def _leftovers(tls: TlsFiles) -> list[str]:
    return sorted(p.name for p in tls.cert.parent.iterdir() if p.name.endswith(".next"))


def test_install_replaces_the_pair_and_leaves_nothing_staged(pair: dict[str, Any]) -> None:
    tls = pair["tls"]
    certpair.install(tls, pair["key"], pair["cert"])
    assert _live(tls) == (pair["key"], pair["cert"])
    assert tls.key.stat().st_mode & 0o777 == 0o600
    assert tls.cert.stat().st_mode & 0o777 == 0o644
    assert _leftovers(tls) == []
    assert certpair.recover(tls) == ""


def test_a_crash_between_the_renames_is_finished(pair: dict[str, Any]) -> None:
    tls = pair["tls"]
    tls.key.write_bytes(pair["key"])  # the key renamed; the certificate still staged
    (tls.cert.parent / (tls.cert.name + ".next")).write_bytes(pair["cert"])
    assert not certpair.pair_matches(*_live(tls))
    assert certpair.recover(tls) == "finished the staged install"
    assert _live(tls) == (pair["key"], pair["cert"]) and _leftovers(tls) == []


def test_a_crash_after_staging_both_is_finished(pair: dict[str, Any]) -> None:
    tls = pair["tls"]
    (tls.key.parent / (tls.key.name + ".next")).write_bytes(pair["key"])
    (tls.cert.parent / (tls.cert.name + ".next")).write_bytes(pair["cert"])
    assert certpair.recover(tls) == "finished the staged install"
    assert _live(tls) == (pair["key"], pair["cert"]) and _leftovers(tls) == []


def test_a_crash_while_staging_keeps_the_live_pair(pair: dict[str, Any]) -> None:
    tls = pair["tls"]
    before = _live(tls)
    (tls.key.parent / (tls.key.name + ".next")).write_bytes(pair["key"])  # no certificate
    assert certpair.recover(tls) == "removed a staged key without its certificate"
    assert _live(tls) == before and _leftovers(tls) == []


def test_staged_files_that_are_no_pair_are_removed(pair: dict[str, Any]) -> None:
    tls = pair["tls"]
    before = _live(tls)
    (tls.key.parent / (tls.key.name + ".next")).write_bytes(before[0])  # the old key
    (tls.cert.parent / (tls.cert.name + ".next")).write_bytes(pair["cert"])
    assert certpair.recover(tls) == "removed staged files that are no pair"
    assert _live(tls) == before and _leftovers(tls) == []
    assert certpair.pair_matches(*_live(tls))


@pytest.mark.parametrize("staged", ["garbage", "encrypted-key", "truncated"])
def test_a_staged_certificate_or_key_that_does_not_load_is_removed_never_installed(
    pair: dict[str, Any], staged: str
) -> None:
    """Staged bytes that are not a key and certificate (rot, a truncated write, a key under
    a passphrase: ValueError or TypeError from the parser) are no pair: removed, and the
    live pair stays; the certificate is never renamed into place."""
    from cryptography.hazmat.primitives import serialization

    tls = pair["tls"]
    before = _live(tls)
    key, cert = pair["key"], pair["cert"]
    if staged == "garbage":
        cert = b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"
    elif staged == "encrypted-key":
        loaded = serialization.load_pem_private_key(key, None)
        key = loaded.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    else:
        key = key[: len(key) // 2]
    assert not certpair.pair_matches(key, cert)
    (tls.key.parent / (tls.key.name + ".next")).write_bytes(key)
    (tls.cert.parent / (tls.cert.name + ".next")).write_bytes(cert)
    assert certpair.recover(tls) == "removed staged files that are no pair"
    assert _live(tls) == before and _leftovers(tls) == []


def test_a_staged_certificate_that_is_not_the_renamed_keys_is_removed(
    pair: dict[str, Any], tmp_path: Path
) -> None:
    """The key was renamed already (no staged key left) and the staged certificate is not
    its: the certificate is removed (the missing staged key is no error)."""
    tls = pair["tls"]
    tls.key.write_bytes(pair["key"])
    other, _ = issue(tmp_path / "ca", "host", host_id="h2", rack="r1", out_dir=tmp_path / "o")
    (tls.cert.parent / (tls.cert.name + ".next")).write_bytes(other.read_bytes())
    assert certpair.recover(tls) == "removed staged files that are no pair"
    assert _leftovers(tls) == [] and tls.key.read_bytes() == pair["key"]


def test_an_agent_starts_on_a_directory_a_crash_left_mid_install(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.enrolled["h1"] = ("r1", "cluster=inf-a")
    pki = cluster.pki
    own = tmp_path / "h1-pki"
    own.mkdir()
    for name in ("ca.pem", "h1.pem", "h1.key"):
        shutil.copy2(pki / name, own / name)
    fresh, fresh_key = issue(pki, "host", host_id="h1", rack="r1", out_dir=tmp_path / "new")
    (own / "h1.key").write_bytes(fresh_key.read_bytes())  # renamed before the crash
    (own / "h1.pem.next").write_bytes(fresh.read_bytes())  # still staged
    cluster.start_coordinator()
    args = [
        "--ca",
        str(own / "ca.pem"),
        "--cert",
        str(own / "h1.pem"),
        "--key",
        str(own / "h1.key"),
    ]
    cluster.start_agent("h1", "r1", extra_args=args)
    assert cluster.procs["h1"].poll() is None
    assert (own / "h1.pem").read_bytes() == fresh.read_bytes()
    assert not (own / "h1.pem.next").exists()
    ctx = data_client_context(cluster.tls("operator"))
    addr, _, port = cluster.agents["h1"]["dataAddress"].rpartition(":")
    with socket.create_connection((addr, int(port)), timeout=10) as raw, ctx.wrap_socket(raw) as c:
        der = c.getpeercert(binary_form=True)
    assert der is not None
    presented = serial_of(ssl.DER_cert_to_PEM_cert(der).encode("ascii"))
    assert presented == serial_of(fresh.read_bytes())
    log = (cluster.base / "logs" / "h1.log").read_text(errors="replace")
    assert "finished a certificate install a restart cut short" in log
