"""CA rotation in the CA directory: two CAs trusted during an overlap (docs/agent-ca-rotation.md).

Three steps, each one atomic file change the coordinator reads at its next handshake and
serves to hosts (``AgentService.TrustBundle``); hosts poll it and load it without a restart:

1. :func:`rotate`: a new CA key (``ca-next.key``) and its certificate appended to ``ca.pem``.
   The old CA still signs; every process learns to trust the new one.
2. :func:`promote`: the new CA signs (``ca.key``) and leads the bundle. Hosts see the signer
   change and renew onto it; the coordinator's and operators' certificates are reissued.
3. :func:`retire`: the bundle keeps the signing CA only; certificates of the old one are
   refused from then on.

Each step refuses out of order (``ca-rotation``), so a rotation cannot skip the overlap.
A crash between two writes of a step leaves a state the same step completes when run again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from relgate_trust.fstree import write_file_atomic

from relgate_agent.identity.cabundle import CaBundle, fingerprint
from relgate_agent.pki import (
    CA_CERT,
    CA_KEY,
    PkiError,
    cert_for_key,
    load_signer,
    new_ca,
    private_key_pem,
)

CA_NEXT_KEY = "ca-next.key"
CHECK_CA_ROTATION = "ca-rotation"


@dataclass(frozen=True)
class RotationState:
    """What the CA directory holds now (``relgate-agent ca status``)."""

    signer: str  # fingerprint of the signing CA
    trusted: tuple[str, ...]  # the bundle, in order
    pending: str  # fingerprint of the next CA (rotated, not promoted), or ""

    @property
    def step(self) -> str:
        if self.pending:
            return "rotated"  # next: promote
        return "overlap" if len(self.trusted) > 1 else "single"  # next: retire / rotate


def state(directory: Path) -> RotationState:
    d = Path(directory)
    _, signer = load_signer(d)
    bundle = _bundle(d)
    pending = ""
    if (d / CA_NEXT_KEY).exists():
        pending = fingerprint(_cert_for(bundle, _load_key(d / CA_NEXT_KEY), d))
    return RotationState(fingerprint(signer), tuple(fingerprint(c) for c in bundle.cas), pending)


def rotate(directory: Path, common_name: str = "relgate fleet CA") -> RotationState:
    """Make the next CA and trust it beside the signing one."""
    d = Path(directory)
    now = state(d)
    if now.pending:
        raise PkiError(
            f"a rotation is under way in {d} (CA {now.pending[:16]} not promoted yet)",
            check=CHECK_CA_ROTATION,
        )
    if now.step == "overlap":
        raise PkiError(
            f"{d} still trusts a retiring CA: retire it before the next rotation",
            check=CHECK_CA_ROTATION,
        )
    key, cert = new_ca(common_name)
    # the key first: a bundle naming a CA whose key is lost would be a CA nobody can promote
    write_file_atomic(d / CA_NEXT_KEY, private_key_pem(key), 0o600)
    pem = _bundle(d).pem() + cert.public_bytes(serialization.Encoding.PEM)
    write_file_atomic(d / CA_CERT, pem, 0o644)
    return state(d)


def promote(directory: Path) -> RotationState:
    """The next CA signs from now on and leads the bundle; the old one is still trusted."""
    d = Path(directory)
    if not (d / CA_NEXT_KEY).exists():
        raise PkiError(f"no rotated CA to promote in {d} (run ca rotate)", check=CHECK_CA_ROTATION)
    key = _load_key(d / CA_NEXT_KEY)
    bundle = _bundle(d)
    cert = _cert_for(bundle, key, d)
    others = [c for c in bundle.cas if c is not cert]
    write_file_atomic(d / CA_CERT, CaBundle((cert, *others)).pem(), 0o644)
    write_file_atomic(d / CA_KEY, private_key_pem(key), 0o600)
    (d / CA_NEXT_KEY).unlink()
    return state(d)


def retire(directory: Path) -> RotationState:
    """Trust the signing CA only (and a rotated one not yet promoted)."""
    d = Path(directory)
    now = state(d)
    if now.step != "overlap":
        raise PkiError(f"{d} trusts no CA to retire (state {now.step})", check=CHECK_CA_ROTATION)
    keep = [c for c in _bundle(d).cas if fingerprint(c) == now.signer]
    write_file_atomic(d / CA_CERT, CaBundle(tuple(keep)).pem(), 0o644)
    return state(d)


def _bundle(d: Path) -> CaBundle:
    try:
        return CaBundle.parse((d / CA_CERT).read_bytes())
    except OSError as exc:
        raise PkiError(f"no CA bundle in {d}: {exc}", check="ca-unusable") from exc


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), None)
    except (OSError, ValueError) as exc:
        raise PkiError(f"{path}: {exc}", check="ca-unusable") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{path} is not an ECDSA key", check="ca-unusable")
    return key


def _cert_for(bundle: CaBundle, key: ec.EllipticCurvePrivateKey, d: Path) -> x509.Certificate:
    cert = cert_for_key(bundle.cas, key)
    if cert is not None:
        return cert
    raise PkiError(f"{d / CA_CERT} holds no certificate for {CA_NEXT_KEY}", check="ca-unusable")


__all__ = [
    "CA_NEXT_KEY",
    "CHECK_CA_ROTATION",
    "RotationState",
    "promote",
    "retire",
    "rotate",
    "state",
]
