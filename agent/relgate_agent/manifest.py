"""Checkpoint manifests: build from a directory, sign as a DSSE envelope, verify against trusted keys.

A checkpoint is a set of files laid end to end in one concatenated byte space (sorted by
relative path). That space is cut into chunks (unit of hashing and bookkeeping, SHA-256)
and blocks (unit of forwarding, CRC32C). Chunk size is a multiple of block size, so every
block belongs to exactly one chunk.

The manifest is RFC 8785 canonical JSON holding integers and strings only. Its digest is
SHA-256 over the canonical JSON with ``manifestId`` and ``signatures`` removed, and
``manifestId`` carries that digest. Signed manifests are DSSE envelopes (Ed25519, keyid =
``sha256:<hex>`` of the raw 32-byte public key), the same format as the main package.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import google_crc32c
import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from relgate_agent.errors import ManifestError, VerificationError

PAYLOAD_TYPE = "application/vnd.relgate.checkpoint.manifest.v1+json"
MEDIA_TYPE = PAYLOAD_TYPE
DEFAULT_CHUNK_SIZE = 64 * 1024 * 1024
DEFAULT_BLOCK_SIZE = 4 * 1024 * 1024
_DIGEST_EXCLUDED_KEYS = ("manifestId", "signatures")
_MAX_NAME_LEN = 255


# ---------------------------------------------------------------------------- names


def validate_name(kind: str, value: object) -> str:
    """Validate a model or version name: one safe path component, never a traversal."""
    if not isinstance(value, str) or value == "":
        raise ManifestError(f"{kind} name is empty or not a string: {value!r}")
    if value in (".", "..") or ".." in value:
        raise ManifestError(f"{kind} name {value!r} contains '..'")
    if "/" in value or "\\" in value:
        raise ManifestError(f"{kind} name {value!r} contains a path separator")
    if any(unicodedata.category(ch).startswith("C") for ch in value):
        raise ManifestError(f"{kind} name {value!r} contains control or unassigned characters")
    if len(value.encode("utf-8")) > _MAX_NAME_LEN:
        raise ManifestError(f"{kind} name is longer than {_MAX_NAME_LEN} bytes")
    return value


def validate_relative_path(value: object) -> str:
    """A file path inside a checkpoint: relative, '/'-separated, every component a safe name."""
    if not isinstance(value, str) or value == "":
        raise ManifestError(f"file path is empty or not a string: {value!r}")
    if value.startswith("/"):
        raise ManifestError(f"file path {value!r} is absolute")
    for part in value.split("/"):
        validate_name("file path component", part)
    return value


# ---------------------------------------------------------------------------- model


@dataclass(frozen=True)
class FileEntry:
    path: str
    offset: int
    size: int
    object_version: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "offset": self.offset, "size": self.size}
        if self.object_version:
            out["objectVersion"] = self.object_version
        return out


@dataclass(frozen=True)
class ChunkEntry:
    index: int
    offset: int
    size: int
    digest: str  # sha256:<hex>
    block_crc32c: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "offset": self.offset,
            "size": self.size,
            "digest": self.digest,
            "blockCrc32c": list(self.block_crc32c),
        }


@dataclass(frozen=True)
class CheckpointManifest:
    model: str
    version: str
    total_size: int
    chunk_size: int
    block_size: int
    files: tuple[FileEntry, ...]
    chunks: tuple[ChunkEntry, ...]
    created_at: str = ""
    manifest_id: str = field(default="")

    # -- geometry -----------------------------------------------------------
    @property
    def blocks_per_chunk(self) -> int:
        return self.chunk_size // self.block_size

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    @property
    def num_blocks(self) -> int:
        return (self.total_size + self.block_size - 1) // self.block_size

    def block_range(self, block: int) -> tuple[int, int]:
        """(offset, length) of a global block index in the concatenated byte space."""
        off = block * self.block_size
        return off, min(self.block_size, self.total_size - off)

    def block_chunk(self, block: int) -> int:
        return block // self.blocks_per_chunk

    def block_crc(self, block: int) -> int:
        chunk = self.chunks[block // self.blocks_per_chunk]
        return chunk.block_crc32c[block % self.blocks_per_chunk]

    def chunk_blocks(self, chunk: int) -> range:
        first = chunk * self.blocks_per_chunk
        return range(first, first + len(self.chunks[chunk].block_crc32c))

    def stripe_blocks(self, stripe: int, stripes: int) -> list[int]:
        """Global block indexes of one stripe, in stream order (chunk index mod stripes)."""
        out: list[int] = []
        for chunk in range(stripe, self.num_chunks, stripes):
            out.extend(self.chunk_blocks(chunk))
        return out

    def segments(self, offset: int, length: int) -> list[tuple[FileEntry, int, int, int]]:
        """Split a byte range into (file, file_offset, length, position_in_range) pieces."""
        out: list[tuple[FileEntry, int, int, int]] = []
        end = offset + length
        pos = offset
        for f in self.files:
            if f.offset + f.size <= pos or f.size == 0:
                continue
            if f.offset >= end:
                break
            start = max(pos, f.offset)
            stop = min(end, f.offset + f.size)
            out.append((f, start - f.offset, stop - start, start - offset))
            pos = stop
        if pos != end and length > 0:
            raise ManifestError(f"range {offset}+{length} runs past the checkpoint end")
        return out

    # -- JSON ----------------------------------------------------------------
    def body(self) -> dict[str, Any]:
        """The manifest without manifestId (what the digest covers)."""
        return {
            "mediaType": MEDIA_TYPE,
            "model": self.model,
            "version": self.version,
            "totalSize": self.total_size,
            "chunkSize": self.chunk_size,
            "blockSize": self.block_size,
            "createdAt": self.created_at,
            "files": [f.to_json() for f in self.files],
            "chunks": [c.to_json() for c in self.chunks],
        }

    def to_json(self) -> dict[str, Any]:
        out = self.body()
        out["manifestId"] = self.manifest_id or manifest_digest(out)
        return out

    def canonical_bytes(self) -> bytes:
        return rfc8785.dumps(self.to_json())

    @property
    def digest(self) -> str:
        return manifest_digest(self.body())

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CheckpointManifest:
        """Parse and structurally validate a manifest; refuses anything inconsistent."""
        try:
            if doc.get("mediaType") != MEDIA_TYPE:
                raise ManifestError(f"manifest mediaType {doc.get('mediaType')!r} != {MEDIA_TYPE}")
            model = validate_name("model", doc["model"])
            version = validate_name("version", doc["version"])
            total = _int(doc, "totalSize")
            chunk_size = _int(doc, "chunkSize")
            block_size = _int(doc, "blockSize")
            created_at = doc.get("createdAt", "")
            if not isinstance(created_at, str):
                raise ManifestError("manifest createdAt is not a string")
            files = tuple(
                FileEntry(
                    path=validate_relative_path(f["path"]),
                    offset=_int(f, "offset"),
                    size=_int(f, "size"),
                    object_version=str(f.get("objectVersion", "")),
                )
                for f in doc["files"]
            )
            chunks = tuple(
                ChunkEntry(
                    index=_int(c, "index"),
                    offset=_int(c, "offset"),
                    size=_int(c, "size"),
                    digest=_digest_str(c["digest"]),
                    block_crc32c=tuple(int(x) for x in c["blockCrc32c"] if _is_int(x)),
                )
                for c in doc["chunks"]
            )
        except (KeyError, TypeError) as exc:
            raise ManifestError(f"manifest is missing or mistypes a field: {exc!r}") from exc
        m = cls(model, version, total, chunk_size, block_size, files, chunks, created_at)
        m._check_geometry()
        digest = manifest_digest(m.body())
        claimed = doc.get("manifestId", digest)
        if claimed != digest:
            raise ManifestError(f"manifestId {claimed} does not match recomputed digest {digest}")
        return cls(model, version, total, chunk_size, block_size, files, chunks, created_at, digest)

    def _check_geometry(self) -> None:
        if self.block_size <= 0 or self.chunk_size <= 0 or self.chunk_size % self.block_size:
            raise ManifestError(
                f"chunkSize {self.chunk_size} must be a positive multiple of blockSize {self.block_size}"
            )
        pos = 0
        seen: set[str] = set()
        for f in self.files:
            if f.path in seen:
                raise ManifestError(f"file {f.path!r} listed twice")
            seen.add(f.path)
            if f.offset != pos or f.size < 0:
                raise ManifestError(f"file {f.path!r} offset {f.offset} is not contiguous at {pos}")
            pos += f.size
        if pos != self.total_size:
            raise ManifestError(f"files sum to {pos} bytes but totalSize is {self.total_size}")
        expected_chunks = (self.total_size + self.chunk_size - 1) // self.chunk_size
        if len(self.chunks) != expected_chunks:
            raise ManifestError(
                f"manifest has {len(self.chunks)} chunks, expected {expected_chunks}"
            )
        for i, c in enumerate(self.chunks):
            size = min(self.chunk_size, self.total_size - i * self.chunk_size)
            nblocks = (size + self.block_size - 1) // self.block_size
            if c.index != i or c.offset != i * self.chunk_size or c.size != size:
                raise ManifestError(
                    f"chunk {i} has index/offset/size {c.index}/{c.offset}/{c.size}"
                )
            if len(c.block_crc32c) != nblocks:
                raise ManifestError(
                    f"chunk {i} lists {len(c.block_crc32c)} block CRCs, expected {nblocks}"
                )


def _is_int(x: object) -> bool:
    if not isinstance(x, int) or isinstance(x, bool):
        raise ManifestError(f"expected an integer, got {x!r}")
    return True


def _int(doc: Mapping[str, Any], key: str) -> int:
    v = doc[key]
    _is_int(v)
    if v < 0:
        raise ManifestError(f"{key} is negative: {v}")
    return int(v)


def _digest_str(v: object) -> str:
    if not isinstance(v, str) or not v.startswith("sha256:") or len(v) != 71:
        raise ManifestError(f"not a sha256 digest: {v!r}")
    int(v[7:], 16)
    return v


def manifest_digest(doc: Mapping[str, Any]) -> str:
    """sha256:<hex> over RFC 8785 canonical JSON with manifestId and signatures removed."""
    body = {k: v for k, v in doc.items() if k not in _DIGEST_EXCLUDED_KEYS}
    return "sha256:" + hashlib.sha256(rfc8785.dumps(body)).hexdigest()


def crc32c(data: bytes | bytearray | memoryview) -> int:
    return int(google_crc32c.value(bytes(data)))


def chunk_digest(data: bytes | bytearray | memoryview) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------- build


def _list_files(root: Path) -> list[tuple[str, Path]]:
    """Regular files under root (the shared walker: symlinks, devices, FIFOs refused)."""
    from relgate_agent.fstree import walk_checkpoint_tree

    return [(f.rel, f.path) for f in walk_checkpoint_tree(root)]


def build_manifest(
    directory: str | os.PathLike[str],
    model: str,
    version: str,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_size: int = DEFAULT_BLOCK_SIZE,
    created_at: str = "",
    object_versions: Mapping[str, str] | None = None,
) -> CheckpointManifest:
    """Hash every file under ``directory`` into a manifest (reads every byte once)."""
    validate_name("model", model)
    validate_name("version", version)
    if block_size <= 0 or chunk_size <= 0 or chunk_size % block_size:
        raise ManifestError(
            f"chunk_size {chunk_size} must be a positive multiple of block_size {block_size}"
        )
    root = Path(directory)
    if not root.is_dir():
        raise ManifestError(f"checkpoint directory {root} does not exist")
    listed = _list_files(root)
    files: list[FileEntry] = []
    pos = 0
    for rel, p in listed:
        size = p.stat().st_size
        ver = (object_versions or {}).get(rel, "")
        files.append(FileEntry(rel, pos, size, ver))
        pos += size
    total = pos

    chunks: list[ChunkEntry] = []
    sha = hashlib.sha256()
    crcs: list[int] = []
    block_buf = bytearray()
    chunk_fill = 0

    def finish_block() -> None:
        crcs.append(crc32c(block_buf))
        block_buf.clear()

    def finish_chunk() -> None:
        nonlocal sha, crcs, chunk_fill
        idx = len(chunks)
        chunks.append(
            ChunkEntry(idx, idx * chunk_size, chunk_fill, "sha256:" + sha.hexdigest(), tuple(crcs))
        )
        sha = hashlib.sha256()
        crcs = []
        chunk_fill = 0

    for _rel, p in listed:
        with open(p, "rb") as fh:
            while True:
                want = block_size - len(block_buf)
                data = fh.read(want)
                if not data:
                    break
                block_buf += data
                sha.update(data)
                chunk_fill += len(data)
                if len(block_buf) == block_size:
                    finish_block()
                    if chunk_fill == chunk_size:
                        finish_chunk()
    if block_buf:
        finish_block()
    if chunk_fill:
        finish_chunk()
    m = CheckpointManifest(
        model, version, total, chunk_size, block_size, tuple(files), tuple(chunks), created_at
    )
    m._check_geometry()
    return CheckpointManifest(
        model,
        version,
        total,
        chunk_size,
        block_size,
        tuple(files),
        tuple(chunks),
        created_at,
        m.digest,
    )


# ---------------------------------------------------------------------------- keys


def keyid_for(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def generate_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def write_keypair(private_key: Ed25519PrivateKey, private_path: Path, public_path: Path) -> None:
    """PEM PKCS8 private key (mode 0600) and PEM SubjectPublicKeyInfo public key."""
    pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    public_path.write_bytes(
        private_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise VerificationError(f"{path} is not an Ed25519 private key")
    return key


@dataclass(frozen=True)
class TrustedKeys:
    """An explicit set of trusted Ed25519 public keys, by keyid."""

    keys: Mapping[str, Ed25519PublicKey]

    @classmethod
    def load(
        cls, sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
    ) -> TrustedKeys:
        """Load PEM SubjectPublicKeyInfo files; a directory contributes every *.pem inside it."""
        if isinstance(sources, (str, os.PathLike)):
            sources = [sources]
        paths: list[Path] = []
        for s in sources:
            p = Path(s)
            if p.is_dir():
                paths.extend(sorted(q for q in p.iterdir() if q.is_file() and q.suffix == ".pem"))
            else:
                paths.append(p)
        keys: dict[str, Ed25519PublicKey] = {}
        for p in paths:
            try:
                key = serialization.load_pem_public_key(p.read_bytes())
            except (ValueError, OSError) as exc:
                raise VerificationError(f"trusted key {p} is not a PEM public key: {exc}") from exc
            if not isinstance(key, Ed25519PublicKey):
                raise VerificationError(f"trusted key {p} is not an Ed25519 public key")
            keys[keyid_for(key)] = key
        if not keys:
            raise VerificationError(
                "the trusted key set is empty; verification needs explicit keys"
            )
        return cls(keys)

    @classmethod
    def of(cls, *public_keys: Ed25519PublicKey) -> TrustedKeys:
        if not public_keys:
            raise VerificationError(
                "the trusted key set is empty; verification needs explicit keys"
            )
        return cls({keyid_for(k): k for k in public_keys})


# ---------------------------------------------------------------------------- DSSE


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE pre-authentication encoding."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def sign_manifest(manifest: CheckpointManifest, private_key: Ed25519PrivateKey) -> dict[str, Any]:
    """A DSSE envelope over the manifest's canonical JSON."""
    payload = manifest.canonical_bytes()
    sig = private_key.sign(pae(PAYLOAD_TYPE, payload))
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.standard_b64encode(payload).decode("ascii"),
        "signatures": [
            {
                "keyid": keyid_for(private_key.public_key()),
                "sig": base64.standard_b64encode(sig).decode("ascii"),
            }
        ],
    }


def envelope_bytes(envelope: Mapping[str, Any]) -> bytes:
    return json.dumps(envelope, sort_keys=True, separators=(",", ":")).encode("utf-8")


def verify_envelope(
    envelope: Mapping[str, Any] | bytes | str,
    trusted_keys: TrustedKeys | Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
) -> CheckpointManifest:
    """Verify a DSSE envelope against an explicit trusted key set and return the manifest.

    Refuses (raises VerificationError) when unsigned, signed only by unknown keys, when a
    signature does not verify, or when the payload is not a well-formed canonical manifest.
    """
    if not isinstance(trusted_keys, TrustedKeys):
        trusted_keys = TrustedKeys.load(trusted_keys)
    if isinstance(envelope, (bytes, str)):
        try:
            envelope = json.loads(envelope)
        except ValueError as exc:
            raise VerificationError(f"envelope is not JSON: {exc}") from exc
    if not isinstance(envelope, Mapping):
        raise VerificationError("envelope is not a JSON object")
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise VerificationError(
            f"envelope payloadType {envelope.get('payloadType')!r} != {PAYLOAD_TYPE}"
        )
    try:
        payload = base64.b64decode(str(envelope["payload"]), validate=True)
    except (KeyError, binascii.Error) as exc:
        raise VerificationError(f"envelope payload is missing or not base64: {exc}") from exc
    sigs = envelope.get("signatures")
    if not isinstance(sigs, list) or not sigs:
        raise VerificationError("envelope is unsigned; refusing")
    signed_input = pae(PAYLOAD_TYPE, payload)
    verified_by: str | None = None
    unknown: list[str] = []
    for s in sigs:
        if not isinstance(s, Mapping):
            continue
        keyid = str(s.get("keyid", ""))
        key = trusted_keys.keys.get(keyid)
        if key is None:
            unknown.append(keyid)
            continue
        try:
            key.verify(base64.b64decode(str(s.get("sig", "")), validate=True), signed_input)
        except (InvalidSignature, binascii.Error) as exc:
            raise VerificationError(
                f"signature by {keyid} does not verify: manifest tampered"
            ) from exc
        verified_by = keyid
    if verified_by is None:
        raise VerificationError(f"no signature by a trusted key (signed by {unknown}); refusing")
    try:
        doc = json.loads(payload)
    except ValueError as exc:
        raise VerificationError(f"signed payload is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise VerificationError("signed payload is not a JSON object")
    if rfc8785.dumps(doc) != payload:
        raise VerificationError("signed payload is not RFC 8785 canonical JSON")
    try:
        return CheckpointManifest.from_json(doc)
    except ManifestError as exc:
        raise VerificationError(f"signed manifest is invalid: {exc}") from exc


def write_envelope(envelope: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    Path(path).write_bytes(envelope_bytes(envelope))
