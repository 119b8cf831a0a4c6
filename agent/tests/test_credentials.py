"""The coordinator's TLS files reloaded at the next handshake (coordinator/credentials.py).

``fetch`` is what gRPC asks before each new handshake: None keeps the configuration in
force, a configuration replaces it.  A reissued certificate is served to the next
connection (a real gRPC server and a real TLS handshake); a set that does not load, whose
key is not the certificate's, or whose certificate is for another role keeps the one in
force and is looked at again next time; a failing ``on_change`` hook never breaks a
handshake.
"""

from __future__ import annotations

import logging
import shutil
import socket
import ssl
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from relgate_agent.coordinator.credentials import ReloadingCredentials
from relgate_agent.pki import TlsFiles, ca_init, data_client_context, issue


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, object]:
    """A CA, the coordinator's live files in ``live/``, and an operator's in ``ca/``."""
    ca = tmp_path / "ca"
    ca_init(ca)
    issue(ca, "coordinator", out_dir=tmp_path / "live")
    issue(ca, "operator")
    return {"ca": ca, "live": TlsFiles.from_pki(tmp_path / "live", "coordinator")}


def _install(source: Path, target: Path) -> None:
    """Replace ``target`` as a renewal does: a new file renamed over it (a new inode)."""
    staged = target.with_name(target.name + ".new")
    shutil.copyfile(source, staged)
    staged.replace(target)


def _reissue(ca: Path, live: TlsFiles, tmp_path: Path, role: str = "coordinator") -> bytes:
    """A new certificate and key for ``role`` installed over the live files; its PEM."""
    cert, key = issue(ca, role, out_dir=tmp_path / "fresh")
    _install(key, live.key)
    _install(cert, live.cert)
    return cert.read_bytes()


def test_unchanged_files_keep_the_configuration(pki: dict[str, object]) -> None:
    creds = ReloadingCredentials(pki["live"])  # type: ignore[arg-type]
    assert creds.fetch() is None and creds.fetch() is None
    assert creds.reloads == 0


def test_a_reissued_certificate_is_loaded_once_and_told(
    pki: dict[str, object], tmp_path: Path
) -> None:
    told: list[TlsFiles] = []
    live: TlsFiles = pki["live"]  # type: ignore[assignment]
    creds = ReloadingCredentials(live, on_change=told.append)
    _reissue(pki["ca"], live, tmp_path)  # type: ignore[arg-type]
    assert creds.fetch() is not None
    assert (creds.reloads, told) == (1, [live])
    assert creds.fetch() is None  # the same files: nothing more
    assert creds.reloads == 1


@pytest.mark.parametrize("fault", ["mismatched-key", "other-role", "missing-key", "garbage"])
def test_a_set_that_does_not_load_keeps_the_one_in_force_and_is_looked_at_again(
    pki: dict[str, object], tmp_path: Path, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    live: TlsFiles = pki["live"]  # type: ignore[assignment]
    ca: Path = pki["ca"]  # type: ignore[assignment]
    creds = ReloadingCredentials(live)
    if fault == "mismatched-key":  # the key renamed, the certificate not yet
        _, key = issue(ca, "coordinator", out_dir=tmp_path / "half")
        _install(key, live.key)
    elif fault == "other-role":
        _reissue(ca, live, tmp_path, role="operator")
    elif fault == "missing-key":
        live.key.unlink()
    else:
        live.cert.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n")
    with caplog.at_level(logging.WARNING):
        assert creds.fetch() is None
        assert creds.fetch() is None  # looked at again, still refused
    assert creds.reloads == 0
    assert "TLS files not reloaded, keeping the current ones" in caplog.text
    _reissue(ca, live, tmp_path)  # the set completed: loaded at the next handshake
    assert creds.fetch() is not None and creds.reloads == 1


def test_a_failing_hook_does_not_break_the_handshake(
    pki: dict[str, object], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_: TlsFiles) -> None:
        raise RuntimeError("hook failed")

    live: TlsFiles = pki["live"]  # type: ignore[assignment]
    creds = ReloadingCredentials(live, on_change=broken)
    _reissue(pki["ca"], live, tmp_path)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        assert creds.fetch() is not None
    assert creds.reloads == 1 and "after the TLS reload: hook failed" in caplog.text


def _served_serial(port: int, client: TlsFiles) -> int:
    """The serial of the certificate the server presents to a new TLS connection."""
    ctx = data_client_context(client)
    ctx.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_a_real_server_presents_the_reissued_certificate_to_the_next_connection(
    pki: dict[str, object], tmp_path: Path
) -> None:
    live: TlsFiles = pki["live"]  # type: ignore[assignment]
    client = TlsFiles.from_pki(pki["ca"], "operator")  # type: ignore[arg-type]
    creds = ReloadingCredentials(live)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_secure_port("127.0.0.1:0", creds.credentials)
    server.start()
    try:
        first = _served_serial(port, client)
        assert first == x509.load_pem_x509_certificate(live.cert.read_bytes()).serial_number
        assert _served_serial(port, client) == first  # unchanged files: the same one
        renewed = x509.load_pem_x509_certificate(_reissue(pki["ca"], live, tmp_path))  # type: ignore[arg-type]
        assert _served_serial(port, client) == renewed.serial_number != first
        assert creds.reloads == 1
        assert not _answers_without_a_client_certificate(port, live)  # still mutual TLS
    finally:
        server.stop(grace=None).wait(10)


def _answers_without_a_client_certificate(port: int, live: TlsFiles) -> bool:
    ctx = ssl.create_default_context(cafile=str(live.ca))
    ctx.check_hostname = False
    ctx.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            ctx.wrap_socket(raw) as tls,
        ):
            tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            return bool(tls.recv(64))  # TLS 1.3: the refusal arrives after the handshake
    except (ssl.SSLError, ConnectionError):
        return False
