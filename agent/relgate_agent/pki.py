"""Fleet PKI: a CA, short-lived role certificates, and the TLS settings of both planes.

Every process in a fleet holds a certificate issued by the fleet CA (ECDSA P-256). The role
and identity live in a SAN URI, which is the only thing authorization reads:

    spiffe://relgate/operator/<name>            may create, inspect, cancel jobs, enroll hosts
    spiffe://relgate/coordinator/<name>         serves the control plane (DNS SAN coordinator.relgate)
    spiffe://relgate/host/<host-id>?rack=<rack> an agent: agent RPCs for that host id only,
                                                data plane as that host id

The subject repeats it for people (CN = name / host id, OU = role, L = rack).

A PKI directory holds ``ca.pem`` (+ ``ca.key`` where certificates are issued) and, per
identity, ``<name>.pem`` / ``<name>.key`` (hosts: the host id; operator: ``operator``;
coordinator: ``coordinator``). Private keys are written atomically with mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from relgate_trust.fstree import write_file_atomic

from relgate_agent.errors import AgentError
from relgate_agent.identity import certlife
from relgate_agent.identity.certlife import RevokedCerts

ROLES = ("operator", "coordinator", "host")
ROLE_OPERATOR, ROLE_COORDINATOR, ROLE_HOST = ROLES
SPIFFE_PREFIX = "spiffe://relgate/"
# Agents and operators check the coordinator's certificate against this name (gRPC target
# name override), so the coordinator's address may be anything (IP, unix socket).
COORDINATOR_DNS = "coordinator.relgate"
CA_CERT, CA_KEY = "ca.pem", "ca.key"
DEFAULT_VALIDITY_H = 72
CA_VALIDITY_DAYS = 365
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # used with fullmatch (no "\n")


class PkiError(AgentError):
    """A certificate or key is missing, malformed, expired or not for this fleet; ``check``
    names the rule (printed by the CLI's refusal, exit 3)."""

    def __init__(self, message: str, *, check: str = "pki") -> None:
        super().__init__(message)
        self.check = check


@dataclass(frozen=True)
class Identity:
    """Who is on the other end of a TLS connection, as the fleet CA certified it."""

    role: str
    name: str  # host id for hosts
    rack: str = ""

    @property
    def uri(self) -> str:
        return identity_uri(self.role, self.name, self.rack)

    def __str__(self) -> str:
        return f"{self.role}:{self.name}" + (f"@{self.rack}" if self.rack else "")


def check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise PkiError(
            f"{kind} {value!r} is not a valid name ([A-Za-z0-9._-], max 128)", check="pki-name"
        )
    return value


def identity_uri(role: str, name: str, rack: str = "") -> str:
    if role not in ROLES:
        raise PkiError(f"unknown role {role!r}", check="pki-role")
    uri = f"{SPIFFE_PREFIX}{role}/{quote(name, safe='')}"
    if role == ROLE_HOST:
        uri += f"?rack={quote(rack, safe='')}"
    return uri


def parse_identity_uri(uri: str) -> Identity | None:
    """Identity from a SAN URI, or None if it is not a well-formed relgate identity."""
    if not isinstance(uri, str) or not uri.startswith(SPIFFE_PREFIX):
        return None
    parts = urlsplit(uri)
    segs = parts.path.strip("/").split("/")
    if parts.netloc != "relgate" or len(segs) != len(("role", "name")) or parts.fragment:
        return None
    role, name = segs[0], unquote(segs[1])
    if role not in ROLES or not _NAME_RE.fullmatch(name):
        return None
    rack = ""
    if role == ROLE_HOST:
        racks = parse_qs(parts.query, keep_blank_values=True).get("rack", [])
        if len(racks) != 1 or not _NAME_RE.fullmatch(racks[0]):
            return None
        rack = racks[0]
    elif parts.query:
        return None
    return Identity(role, name, rack)


def identity_from_uris(uris: list[str]) -> Identity | None:
    """Exactly one relgate identity URI must be present (two would be ambiguous)."""
    found = [i for i in (parse_identity_uri(u) for u in uris) if i is not None]
    return found[0] if len(found) == 1 else None


@lru_cache(maxsize=4096)
def identity_from_pem(pem: bytes) -> Identity | None:
    """Identity of a certificate that the TLS stack already verified against the fleet CA."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    return identity_from_uris(list(san.get_values_for_type(x509.UniformResourceIdentifier)))


def identity_from_peercert(peercert: Mapping[str, Any] | None) -> Identity | None:
    """Identity from ``ssl.SSLSocket.getpeercert()`` (the verified peer certificate)."""
    if not peercert:
        return None
    san = peercert.get("subjectAltName") or ()
    uris = [v for k, v in san if k == "URI"] if isinstance(san, tuple) else []
    return identity_from_uris([str(u) for u in uris])


# ---------------------------------------------------------------------------- files


def private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def ca_init(directory: Path, common_name: str = "relgate fleet CA", force: bool = False) -> Path:
    """Create ``ca.pem`` / ``ca.key`` (0600). Refuses to overwrite an existing CA unless forced."""
    directory = Path(directory)
    if (directory / CA_KEY).exists() and not force:
        raise PkiError(f"a CA already exists in {directory}", check="ca-exists")
    key, cert = new_ca(common_name)
    write_file_atomic(directory / CA_KEY, private_key_pem(key), 0o600)
    write_file_atomic(directory / CA_CERT, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return directory / CA_CERT


def new_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A fresh self-signed fleet CA (ECDSA P-256, may sign certificates, no intermediates)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def default_name(role: str, host_id: str = "", name: str = "") -> str:
    if role == ROLE_HOST:
        return check_name("host id", host_id)
    return check_name("name", name or role)


LEAF_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=True,
    key_cert_sign=False,
    crl_sign=False,
    encipher_only=False,
    decipher_only=False,
)


def load_signer(directory: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The signing CA: ``ca.key`` and the certificate of ``ca.pem`` (a bundle during a CA
    rotation) whose public key it is."""
    try:
        ca_key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
        cas = x509.load_pem_x509_certificates((directory / CA_CERT).read_bytes())
    except (OSError, ValueError) as exc:
        raise PkiError(f"no usable CA in {directory}: {exc}", check="ca-unusable") from exc
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"CA key in {directory} is not ECDSA", check="ca-unusable")
    ca_cert = cert_for_key(cas, ca_key)
    if ca_cert is not None:
        return ca_key, ca_cert
    raise PkiError(f"{directory / CA_CERT} holds no certificate for {CA_KEY}", check="ca-unusable")


def cert_for_key(
    certs: Iterable[x509.Certificate], key: ec.EllipticCurvePrivateKey
) -> x509.Certificate | None:
    """The certificate of ``certs`` whose public key is ``key``'s (a CA bundle and a CA key)."""
    return next((c for c in certs if c.public_key() == key.public_key()), None)


def sign_leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    role: str,
    ident: str,
    rack: str,
    public_key: CertificatePublicKeyTypes,
    validity_h: float,
    *,
    extra_dns: tuple[str, ...] = (),
) -> x509.Certificate:
    """The fleet's leaf certificate profile (subject, SAN URI, key usages) for ``public_key``:
    one code path for keys made here (:func:`issue`) and keys sent in a CSR
    (:func:`issue_for_csr`)."""
    attrs = [
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "relgate"),
        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
        x509.NameAttribute(NameOID.COMMON_NAME, ident),
    ]
    if rack:
        attrs.append(x509.NameAttribute(NameOID.LOCALITY_NAME, rack))
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity_uri(role, ident, rack))]
    eku = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role in (ROLE_COORDINATOR, ROLE_HOST):
        eku.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if role == ROLE_COORDINATOR:
        sans += [x509.DNSName(COORDINATOR_DNS), x509.DNSName("localhost")]
        sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
        sans += [x509.DNSName(d) for d in extra_dns]
    now = _now()
    not_after = min(now + dt.timedelta(hours=validity_h), ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(LEAF_KEY_USAGE, critical=True)
        .add_extension(x509.ExtendedKeyUsage(eku), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert


def issue(
    directory: Path,
    role: str,
    *,
    host_id: str = "",
    rack: str = "",
    name: str = "",
    validity_h: float = DEFAULT_VALIDITY_H,
    out_dir: Path | None = None,
    extra_dns: tuple[str, ...] = (),
) -> tuple[Path, Path]:
    """Issue a role certificate signed by the CA in ``directory``; returns (cert, key) paths."""
    directory = Path(directory)
    if role not in ROLES:
        raise PkiError(f"unknown role {role!r} (operator, coordinator, host)", check="pki-role")
    ident = default_name(role, host_id, name)
    if role == ROLE_HOST:
        check_name("rack", rack)
    elif rack:
        raise PkiError("--rack is only for host certificates", check="cert-rack")
    if not 0 < validity_h <= 24 * CA_VALIDITY_DAYS:
        raise PkiError(f"validity {validity_h} h is out of range", check="cert-validity")
    ca_key, ca_cert = load_signer(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = sign_leaf(
        ca_key, ca_cert, role, ident, rack, key.public_key(), validity_h, extra_dns=extra_dns
    )
    out = Path(out_dir or directory)
    key_path, cert_path = out / f"{ident}.key", out / f"{ident}.pem"
    write_file_atomic(key_path, private_key_pem(key), 0o600)
    write_file_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    if out != directory and not (out / CA_CERT).exists():
        write_file_atomic(out / CA_CERT, (directory / CA_CERT).read_bytes(), 0o644)
    return cert_path, key_path


def issue_for_csr(
    directory: Path,
    csr: x509.CertificateSigningRequest,
    host_id: str,
    rack: str,
    validity_h: float = DEFAULT_VALIDITY_H,
) -> bytes:
    """A host certificate (PEM) for the key in ``csr``, signed by the CA in ``directory``:
    the same profile as :func:`issue`; the host id and rack are the caller's (the CSR was
    checked against them), never read off the CSR."""
    check_name("host id", host_id)
    check_name("rack", rack)
    if not 0 < validity_h <= 24 * CA_VALIDITY_DAYS:
        raise PkiError(f"validity {validity_h} h is out of range")
    ca_key, ca_cert = load_signer(Path(directory))
    cert = sign_leaf(ca_key, ca_cert, ROLE_HOST, host_id, rack, csr.public_key(), validity_h)
    return cert.public_bytes(serialization.Encoding.PEM)


def cert_info(path: Path) -> dict[str, object]:
    cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
    ident = identity_from_pem(cert.public_bytes(serialization.Encoding.PEM))
    return {
        "path": str(path),
        "identity": ident.uri if ident else "",
        "role": ident.role if ident else "",
        "name": ident.name if ident else "",
        "rack": ident.rack if ident else "",
        "serial": format(cert.serial_number, "x"),
        "not_after": cert.not_valid_after_utc.isoformat(),
        "sha256": cert.fingerprint(hashes.SHA256()).hex(),
    }


def _fresh(
    cert_path: Path, role: str, name: str, rack: str, min_left_h: float, ca: x509.Certificate
) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        cert.verify_directly_issued_by(ca)  # issued by the current CA (it may be new)
    except (OSError, ValueError, TypeError, InvalidSignature):
        return False
    ident = identity_from_pem(cert.public_bytes(serialization.Encoding.PEM))
    left = cert.not_valid_after_utc - _now()
    return (
        ident == Identity(role, name, rack if role == ROLE_HOST else "")
        and left > dt.timedelta(hours=min_left_h)
        and cert_path.with_suffix(".key").exists()
    )


def ensure_dev_pki(home: Path, hosts: dict[str, str] | list[tuple[str, str]]) -> Path:
    """A development PKI under ``home/pki``: CA, coordinator, operator and one cert per host
    (host id -> rack). Missing, expiring (< 1 h left) or mismatching certificates are
    (re)issued; nothing is ever downloaded. Returns the PKI directory (``--pki``)."""
    d = Path(home) / "pki"
    if not (d / CA_KEY).exists() or not _fresh_ca(d):
        ca_init(d, force=True)
    wanted: list[tuple[str, str, str]] = [
        (ROLE_COORDINATOR, ROLE_COORDINATOR, ""),
        (ROLE_OPERATOR, ROLE_OPERATOR, ""),
    ]
    items = hosts.items() if isinstance(hosts, dict) else hosts
    wanted += [(ROLE_HOST, h, r) for h, r in items]
    ca = x509.load_pem_x509_certificate((d / CA_CERT).read_bytes())
    for role, name, rack in wanted:
        if not _fresh(d / f"{name}.pem", role, name, rack, 1.0, ca):
            issue(
                d,
                role,
                host_id=name if role == ROLE_HOST else "",
                rack=rack,
                name="" if role == ROLE_HOST else name,
            )
    return d


def _fresh_ca(d: Path) -> bool:
    try:
        cert = x509.load_pem_x509_certificate((d / CA_CERT).read_bytes())
    except (OSError, ValueError):
        return False
    return cert.not_valid_after_utc - _now() > dt.timedelta(days=1)


# ---------------------------------------------------------------------------- TLS settings


@dataclass(frozen=True)
class TlsFiles:
    """The CA root and one identity's certificate and key (PEM files)."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def from_pki(cls, directory: str | Path, name: str) -> TlsFiles:
        d = Path(directory)
        return cls(d / CA_CERT, d / f"{name}.pem", d / f"{name}.key")

    def read(self) -> tuple[bytes, bytes, bytes]:
        try:
            return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()
        except OSError as exc:
            raise PkiError(f"TLS material missing: {exc}", check="tls-missing") from exc

    def identity(self) -> Identity:
        ident = identity_from_pem(self.read()[1])
        if ident is None:
            raise PkiError(
                f"{self.cert} carries no relgate identity (SAN URI)", check="cert-identity"
            )
        return ident


def resolve_tls(
    pki: str | None, name: str, ca: str | None, cert: str | None, key: str | None
) -> TlsFiles:
    """CLI helper: ``--pki DIR`` (files named after ``name``), explicit files override;
    ``RELGATE_AGENT_PKI`` is the default PKI directory."""
    pki = pki or os.environ.get("RELGATE_AGENT_PKI") or ""
    if not pki and not (ca and cert and key):
        raise PkiError(
            "no TLS identity: pass --pki DIR (or --ca, --cert and --key)", check="tls-unset"
        )
    base = TlsFiles.from_pki(pki, name) if pki else None
    return TlsFiles(
        Path(ca) if ca else base.ca,  # type: ignore[union-attr]
        Path(cert) if cert else base.cert,  # type: ignore[union-attr]
        Path(key) if key else base.key,  # type: ignore[union-attr]
    )


def grpc_server_credentials(tls: TlsFiles) -> object:
    ca, cert, key = tls.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def grpc_channel_credentials(tls: TlsFiles) -> object:
    ca, cert, key = tls.read()
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


GRPC_TLS_OPTIONS = [("grpc.ssl_target_name_override", COORDINATOR_DNS)]


class FleetContext(ssl.SSLContext):
    """A data-plane TLS context that also knows the fleet's revoked certificates (the list
    next to its CA bundle: identity/certlife.py), checked at every handshake and while streaming."""

    revoked: RevokedCerts | None = None


def peer_cert_refusal(conn: ssl.SSLSocket) -> tuple[str, str] | None:
    """(check, why) when the peer's certificate on ``conn`` expired or is revoked now."""
    der = conn.getpeercert(binary_form=True)
    if not der:
        return None
    ctx = conn.context
    revoked = ctx.revoked if isinstance(ctx, FleetContext) else None
    return certlife.refusal(certlife.life_of_der(der), revoked, time.time())


def _base_context(server: bool, tls: TlsFiles) -> ssl.SSLContext:
    ctx = FleetContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.revoked = RevokedCerts.beside(tls.ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    try:
        ctx.load_verify_locations(cafile=str(tls.ca))
        ctx.load_cert_chain(str(tls.cert), str(tls.key))
    except (OSError, ssl.SSLError) as exc:
        raise PkiError(f"cannot load TLS material {tls}: {exc}", check="tls-load") from exc
    return ctx


def data_server_context(tls: TlsFiles) -> ssl.SSLContext:
    return _base_context(True, tls)


def data_client_context(tls: TlsFiles) -> ssl.SSLContext:
    ctx = _base_context(False, tls)
    # peers are named by the host id in their certificate, checked after the handshake
    ctx.check_hostname = False
    return ctx
