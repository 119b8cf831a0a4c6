"""The one DSSE envelope implementation of relgate and relgate-agent: PAE, sign, strict verify.

Both packages sign and verify every document through this module (the core imports it; the
agent never imports the core).  An envelope is hostile until :func:`verify` returns:

* bounded size (:data:`MAX_ENVELOPE_BYTES`), bounded nesting depth checked *before* any
  recursive parse, duplicate keys refused at every level, in the envelope and in the payload;
* exact shape: ``{"payloadType": str, "payload": str, "signatures": [{"keyid": str,
  "sig": str, "keyVersion": int?}, ...]}`` and nothing else; strict, canonical base64;
* at least one signature by a key in an explicit :class:`TrustedKeys` set, for a role that
  may sign this document kind, at the key version the trust set records, not revoked; a
  signature by a trusted key that does not verify is a tampered payload;
* the payload (only after its signature verified) is UTF-8 JSON holding objects, lists,
  strings, booleans, null and integers with ``|i| <= 2**53 - 1`` (no floats), and its bytes
  equal their RFC 8785 canonical form.

Every refusal is a :class:`DsseError` whose ``check`` names the rule (see :data:`CHECKS`).

Keys: keyid = ``sha256:<hex>`` of the raw 32-byte Ed25519 public key.  A key carries a
role (:class:`Role`) and a version.  In a trusted key directory the role and version come
from the file name ``<role>-v<version>[-<anything>].pem`` (what ``relgate init``,
``relgate key rotate`` and ``relgate-agent keygen`` write); a PEM named otherwise is an
*unroled* key, which no document kind admits (``key-role``) unless it is given a role
(``ROLE=PATH``, see :meth:`TrustedKeys.load`).  A
``revoked.json`` file in a trusted directory (``{"schema": "relgate.revoked-keys.v1",
"keyids": [...]}``) lists revoked keyids; their signatures are refused with ``key-revoked``.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from relgate_trust import jcs
from relgate_trust.digests import sha256_digest
from relgate_trust.errors import VerificationError

#: Envelopes (and trust files) larger than this are refused before parsing.
MAX_ENVELOPE_BYTES = 64 * 1024 * 1024
#: Deepest nesting of objects/lists accepted in an envelope or a payload.
MAX_DEPTH = 64
#: At most this many signature entries are looked at.
MAX_SIGNATURES = 16
#: Largest integer magnitude a signed document may hold (interoperable JSON range).
MAX_SAFE_INTEGER = jcs.MAX_SAFE_INTEGER
MAX_INT_DIGITS = 16  # 2^53-1 has 16 digits: longer tokens are refused before int()
REVOKED_SCHEMA = "relgate.revoked-keys.v1"
REVOKED_FILE = "revoked.json"

#: What :func:`parse_json` refuses; the check name is ``<what>-<rule>`` (what = envelope,
#: payload, proof).
JSON_RULES = ("json", "duplicate-key", "depth", "float", "integer-range")
#: Every check name a refusal can carry.
CHECKS = (
    "envelope-size",
    *(f"{what}-{rule}" for what in ("envelope", "payload", "proof") for rule in JSON_RULES),
    "envelope-shape",
    "envelope-base64",
    "payload-type",
    "signature-present",
    "signature-trusted",
    "signature-valid",
    "key-role",
    "key-version",
    "key-revoked",
    "trusted-keys",
    "payload-canonical",
)


class DsseError(VerificationError):
    """A refused envelope or payload; ``check`` names the rule, ``keyid`` the key involved."""

    def __init__(self, message: str, *, check: str, subject: str = "envelope", keyid: str = ""):
        super().__init__(f"{subject}: {message} (check={check})")
        self.reason = message
        self.check = check
        self.subject = subject
        self.keyid = keyid


class Role(StrEnum):
    BUILDER = "builder"  # snapshot manifests, release roots, checkpoint manifests, provenance
    VERIFIER = "verifier"  # validation and verification reports
    APPROVER = "approver"  # approvals
    GATE = "gate"  # gate records


#: Which roles may sign which payload type.  The builder signs what it built (snapshot
#: manifests, release roots, checkpoint manifests); the verifier signs what it checked
#: (validation and verification reports, and the SLSA provenance it issues for a verified
#: root); approvals and gate records have their own keys.
PAYLOAD_ROLES: dict[str, frozenset[Role]] = {
    "application/vnd.relgate.dataset-snapshot.v1+json": frozenset({Role.BUILDER}),
    "application/vnd.relgate.shard-release.v1+json": frozenset({Role.BUILDER}),
    "application/vnd.relgate.checkpoint.manifest.v1+json": frozenset({Role.BUILDER}),
    "application/vnd.relgate.validation-report.v1+json": frozenset({Role.VERIFIER}),
    "application/vnd.relgate.replay-report.v1+json": frozenset({Role.VERIFIER}),
    "application/vnd.relgate.release-verification.v1+json": frozenset({Role.VERIFIER}),
    "application/vnd.relgate.schema-evolution.v1+json": frozenset({Role.VERIFIER}),
    # in-toto statements: the builder's for snapshots, the verifier's for verified roots
    # (each opener names the one role it accepts, relgate.integrity.statement).
    "application/vnd.in-toto+json": frozenset({Role.BUILDER, Role.VERIFIER}),
    "application/vnd.relgate.approval.v1+json": frozenset({Role.APPROVER}),
    "application/vnd.relgate.gate-record.v1+json": frozenset({Role.GATE}),
}


def roles_for(payload_type: str) -> frozenset[Role]:
    """The roles whose keys may sign ``payload_type``: none for a type not listed (fail
    closed)."""
    return PAYLOAD_ROLES.get(payload_type, frozenset())


# ------------------------------------------------------------------------------ keys


def keyid_of(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return sha256_digest(raw)


_ROLED_NAME = re.compile(r"(builder|verifier|approver|gate)-v([1-9][0-9]{0,8})(?:-.*)?\.pem")


def role_of_filename(name: str) -> tuple[Role | None, int]:
    """(role, version) encoded in a trusted key file name, or (None, 1) for an unroled key."""
    m = _ROLED_NAME.fullmatch(name)
    if m is None:
        return None, 1
    return Role(m.group(1)), int(m.group(2))


def key_filename(role: Role, version: int, keyid: str) -> str:
    """The trusted-directory file name of a role key (inverse of :func:`role_of_filename`)."""
    return f"{role.value}-v{version}-{keyid.removeprefix('sha256:')[:16]}.pem"


@dataclass(frozen=True)
class TrustedKey:
    public_key: Ed25519PublicKey
    role: Role | None = None
    version: int = 1

    @property
    def keyid(self) -> str:
        return keyid_of(self.public_key)


@dataclass(frozen=True)
class TrustedKeys:
    """An explicit set of trusted public keys by keyid, with their roles, versions and revocations."""

    keys: Mapping[str, TrustedKey] = field(default_factory=dict)
    revoked: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls, *public_keys: Ed25519PublicKey, role: Role | None = None, version: int = 1
    ) -> TrustedKeys:
        if not public_keys:
            raise DsseError(
                "the trusted key set is empty; verification needs explicit keys",
                check="trusted-keys",
            )
        return cls({keyid_of(k): TrustedKey(k, role, version) for k in public_keys})

    @classmethod
    def load(
        cls, sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
    ) -> TrustedKeys:
        """Load trusted keys from PEM files and directories (every ``*.pem`` and ``revoked.json``).

        An entry ``ROLE=PATH`` (e.g. ``builder=pub.pem``) gives every key under PATH that role.
        """
        sources = [sources] if isinstance(sources, str | os.PathLike) else list(sources)
        keys: dict[str, TrustedKey] = {}
        revoked: set[str] = set()
        for source in sources:
            text = os.fspath(source)
            forced: Role | None = None
            prefix, sep, rest = text.partition("=")
            if sep and prefix in {r.value for r in Role}:
                forced, text = Role(prefix), rest
            path = Path(text)
            if path.is_dir():
                files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix == ".pem")
                if (path / REVOKED_FILE).is_file():
                    revoked |= load_revoked(path / REVOKED_FILE)
            else:
                files = [path]
            for file in files:
                if file.name == REVOKED_FILE:
                    revoked |= load_revoked(file)
                    continue
                key = _load_public_pem(file)
                role, version = role_of_filename(file.name)
                if forced is not None:
                    role = forced
                keys[keyid_of(key)] = TrustedKey(key, role, version)
        if not keys:
            raise DsseError(
                "the trusted key set is empty; verification needs explicit keys",
                check="trusted-keys",
                subject=", ".join(os.fspath(s) for s in sources)[:200],
            )
        return cls(keys, frozenset(revoked))

    def merged(self, other: TrustedKeys) -> TrustedKeys:
        return TrustedKeys({**self.keys, **other.keys}, self.revoked | other.revoked)

    def get(self, keyid: str) -> TrustedKey | None:
        return self.keys.get(keyid)

    def __contains__(self, keyid: object) -> bool:
        return keyid in self.keys

    def __len__(self) -> int:
        return len(self.keys)


def _load_public_pem(file: Path) -> Ed25519PublicKey:
    try:
        data = _read_bounded(file, 64 * 1024)
        key = serialization.load_pem_public_key(data)
    except (OSError, ValueError, TypeError) as exc:
        raise DsseError(
            f"trusted key is not a readable PEM public key: {exc}",
            check="trusted-keys",
            subject=str(file),
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise DsseError(
            "trusted key is not an Ed25519 public key", check="trusted-keys", subject=str(file)
        )
    return key


def _read_bounded(file: Path, limit: int) -> bytes:
    with open(file, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data


def load_revoked(file: Path) -> frozenset[str]:
    """Keyids listed in a revocation file (canonical JSON, strictly parsed)."""
    try:
        data = _read_bounded(file, 4 * 1024 * 1024)
    except (OSError, ValueError) as exc:
        raise DsseError(
            f"revocation list unreadable: {exc}", check="trusted-keys", subject=str(file)
        ) from None
    doc = parse_json(data, what="payload", subject=str(file))
    keyids = doc.get("keyids") if isinstance(doc, dict) else None
    if (
        not isinstance(doc, dict)
        or doc.get("schema") != REVOKED_SCHEMA
        or not isinstance(keyids, list)
        or not all(isinstance(k, str) for k in keyids)
    ):
        raise DsseError(
            f"revocation list is not a {REVOKED_SCHEMA}", check="trusted-keys", subject=str(file)
        )
    return frozenset(keyids)


def revoked_bytes(keyids: Iterable[str]) -> bytes:
    return jcs.dumps({"schema": REVOKED_SCHEMA, "keyids": sorted(set(keyids))})


@dataclass(frozen=True)
class Signer:
    """A private key with the role and version it signs as."""

    private_key: Ed25519PrivateKey
    role: Role | None = None
    version: int = 1

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()

    @property
    def keyid(self) -> str:
        return keyid_of(self.public_key)


# ------------------------------------------------------------------------------ envelopes


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE pre-authentication encoding (the only encoder in relgate and relgate-agent)."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def sign(payload_type: str, payload: bytes, signer: Signer) -> dict[str, Any]:
    """A DSSE envelope over ``payload``; the signature entry carries the key version."""
    sig = signer.private_key.sign(pae(payload_type, payload))
    return {
        "payloadType": payload_type,
        "payload": base64.standard_b64encode(payload).decode("ascii"),
        "signatures": [
            {
                "keyid": signer.keyid,
                "keyVersion": signer.version,
                "sig": base64.standard_b64encode(sig).decode("ascii"),
            }
        ],
    }


def envelope_bytes(envelope: Mapping[str, Any]) -> bytes:
    return jcs.dumps(dict(envelope))


@dataclass(frozen=True)
class Verified:
    """What :func:`verify` proved: the payload bytes, its parsed body, and the signing key."""

    payload_type: str
    payload: bytes
    body: Any
    keyid: str
    role: Role | None
    version: int


_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*+"')
_OPEN = frozenset(b"[{")


def max_depth(data: bytes, limit: int) -> int:
    """Nesting depth of JSON text (strings skipped), without recursion; stops past ``limit``."""
    # Drop escape pairs first, then strings: both regexes are linear (no backtracking).
    brackets = _STRING.sub(b"", _ESCAPE.sub(b"", data)).translate(None, delete=_NOT_BRACKETS)
    depth = deepest = 0
    for ch in brackets:
        if ch in _OPEN:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        else:
            depth -= 1
    return deepest


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class _Refuse(Exception):
    def __init__(self, check: str, message: str) -> None:
        super().__init__(message)
        self.check = check
        self.message = message


def parse_json(
    data: bytes, *, what: str = "payload", subject: str = "envelope", depth: int = MAX_DEPTH
) -> Any:
    """Strict JSON: UTF-8, bounded depth, no duplicate keys, no floats, no NaN, safe integers.

    ``what`` prefixes the check names (``payload-...`` or ``envelope-...``).
    """

    def refuse(check: str, message: str) -> DsseError:
        return DsseError(message, check=f"{what}-{check}", subject=subject)

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise refuse("json", "not UTF-8") from None
    if max_depth(data, depth) > depth:
        raise refuse("depth", f"nested deeper than {depth} levels")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise _Refuse("duplicate-key", f"duplicate key {key[:64]!r}")
            out[key] = value
        return out

    def no_float(token: str) -> Any:
        raise _Refuse("float", f"float {token[:32]} (only integers are allowed)")

    def no_constant(token: str) -> Any:
        raise _Refuse("float", f"non-finite number {token}")

    def safe_int(token: str) -> int:
        digits = token.lstrip("-")
        if (
            len(digits) > MAX_INT_DIGITS
            or int(token) > MAX_SAFE_INTEGER
            or int(token) < -MAX_SAFE_INTEGER
        ):
            raise _Refuse("integer-range", f"integer {token[:32]} beyond 2^53-1")
        return int(token)

    try:
        return json.loads(
            text,
            object_pairs_hook=pairs,
            parse_float=no_float,
            parse_constant=no_constant,
            parse_int=safe_int,
        )
    except _Refuse as exc:
        raise refuse(exc.check, exc.message) from None
    except RecursionError:
        raise refuse("depth", "nested too deeply") from None
    except ValueError as exc:
        raise refuse("json", f"not JSON: {str(exc)[:120]}") from None


def parse_canonical(data: bytes, *, subject: str = "payload", depth: int = MAX_DEPTH) -> Any:
    """Strictly parse a signed payload and require it to be its own RFC 8785 form."""
    body = parse_json(data, what="payload", subject=subject, depth=depth)
    try:
        canonical = jcs.dumps(body)
    except Exception as exc:  # rfc8785 raises its own errors and UnicodeError on lone surrogates
        raise DsseError(
            f"payload has no canonical form: {type(exc).__name__}",
            check="payload-canonical",
            subject=subject,
        ) from None
    if canonical != data:
        raise DsseError(
            "payload is not RFC 8785 canonical JSON", check="payload-canonical", subject=subject
        )
    return body


def _b64(value: str, *, subject: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise DsseError(f"{what} is not base64", check="envelope-base64", subject=subject) from None
    if base64.standard_b64encode(raw).decode("ascii") != value:
        raise DsseError(f"{what} is not canonical base64", check="envelope-base64", subject=subject)
    return raw


def _shape(envelope: Any, subject: str) -> tuple[str, str, list[dict[str, Any]]]:
    def bad(message: str) -> DsseError:
        return DsseError(message, check="envelope-shape", subject=subject)

    if not isinstance(envelope, Mapping):
        raise bad("envelope is not a JSON object")
    extra = set(envelope) - {"payloadType", "payload", "signatures"}
    if extra:
        raise bad(f"envelope has unknown fields {sorted(map(str, extra))[:4]}")
    payload_type, payload = envelope.get("payloadType"), envelope.get("payload")
    if not isinstance(payload_type, str):
        raise bad("payloadType is missing or not a string")
    if not isinstance(payload, str):
        raise bad("payload is missing or not a string")
    signatures = envelope.get("signatures")
    if signatures is None or signatures == []:
        raise DsseError("envelope is unsigned", check="signature-present", subject=subject)
    if not isinstance(signatures, list):
        raise bad("signatures is not a list")
    if len(signatures) > MAX_SIGNATURES:
        raise bad(f"more than {MAX_SIGNATURES} signatures")
    for entry in signatures:
        if not isinstance(entry, Mapping):
            raise bad("a signature entry is not an object")
        if set(entry) - {"keyid", "sig", "keyVersion"}:
            raise bad("a signature entry has unknown fields")
        if not isinstance(entry.get("keyid"), str) or not isinstance(entry.get("sig"), str):
            raise bad("a signature entry's keyid or sig is missing or not a string")
        version = entry.get("keyVersion", 1)
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version < 2**31:
            raise bad("a signature entry's keyVersion is not a positive integer")
    return payload_type, payload, [dict(e) for e in signatures]


def _envelope_doc(
    envelope: bytes | str | Mapping[str, Any], subject: str, max_bytes: int
) -> Mapping[str, Any]:
    """The envelope as a parsed JSON object, size-bounded before parsing."""
    if isinstance(envelope, str):
        envelope = envelope.encode("utf-8")
    if isinstance(envelope, bytes | bytearray | memoryview):
        data = bytes(envelope)
        if len(data) > max_bytes:
            raise DsseError(
                f"envelope is {len(data)} bytes, more than {max_bytes}",
                check="envelope-size",
                subject=subject,
            )
        return parse_json(data, what="envelope", subject=subject)  # type: ignore[no-any-return]
    if len(str(envelope.get("payload", ""))) > max_bytes * 4 // 3 + 4:
        raise DsseError("envelope payload is too large", check="envelope-size", subject=subject)
    return envelope


def _judge(
    entry: Mapping[str, Any],
    trusted: TrustedKeys,
    roles: Collection[Role | None],
    message: bytes,
    payload_type: str,
    subject: str,
) -> TrustedKey | DsseError:
    """The trusted key of a valid signature entry, or why it does not count.

    A signature that does not verify under a trusted key is raised at once (tampering)."""
    keyid = entry["keyid"]
    key = trusted.get(keyid)
    if key is None:
        return DsseError(
            "no signature from a trusted key",
            check="signature-trusted",
            subject=subject,
            keyid=keyid[:80],
        )
    sig = _b64(entry["sig"], subject=subject, what="sig")
    try:
        key.public_key.verify(sig, message)
    except InvalidSignature:
        raise DsseError(
            "signature does not verify: the payload was tampered with after signing",
            check="signature-valid",
            subject=subject,
            keyid=keyid,
        ) from None
    if keyid in trusted.revoked:
        return DsseError(
            "signed by a revoked key", check="key-revoked", subject=subject, keyid=keyid
        )
    if key.role not in roles:
        allowed = sorted(str(r) for r in roles)
        return DsseError(
            f"key role {key.role or 'unroled'} may not sign {payload_type} (allowed: {allowed})",
            check="key-role",
            subject=subject,
            keyid=keyid,
        )
    if "keyVersion" in entry and entry["keyVersion"] != key.version:
        return DsseError(
            f"signature claims key version {entry['keyVersion']}, trusted key is v{key.version}",
            check="key-version",
            subject=subject,
            keyid=keyid,
        )
    return key


def verify(
    envelope: bytes | str | Mapping[str, Any],
    trusted: TrustedKeys,
    *,
    payload_type: str,
    roles: Collection[Role | None],
    subject: str = "envelope",
    max_bytes: int = MAX_ENVELOPE_BYTES,
    canonical: bool = True,
) -> Verified:
    """Verify an envelope and strictly parse its payload; raise :class:`DsseError` otherwise.

    ``roles`` lists the roles allowed to sign this document kind (normally
    :func:`roles_for` of it; ``None`` in it would admit unroled keys, which no document kind
    of relgate or relgate-agent does).  ``canonical=False`` skips parsing the payload (for non-JSON payloads);
    the signature checks are the same.
    """
    doc = _envelope_doc(envelope, subject, max_bytes)
    ptype, payload_b64, signatures = _shape(doc, subject)
    if ptype != payload_type:
        raise DsseError(
            f"payloadType {ptype[:100]!r} is not {payload_type!r}",
            check="payload-type",
            subject=subject,
        )
    if len(trusted) == 0:
        raise DsseError("no trusted keys configured", check="trusted-keys", subject=subject)
    payload = _b64(payload_b64, subject=subject, what="payload")
    message = pae(payload_type, payload)
    accepted: TrustedKey | None = None
    refusals: list[DsseError] = []
    for entry in signatures:
        judged = _judge(entry, trusted, roles, message, payload_type, subject)
        if isinstance(judged, DsseError):
            refusals.append(judged)
        elif accepted is None:
            accepted = judged
    if accepted is None:
        order = ["key-revoked", "key-role", "key-version", "signature-trusted"]
        refusals.sort(key=lambda e: order.index(e.check))
        raise refusals[0]
    body = parse_canonical(payload, subject=subject) if canonical else None
    return Verified(payload_type, payload, body, accepted.keyid, accepted.role, accepted.version)
