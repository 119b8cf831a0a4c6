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

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import google_crc32c
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from relgate_trust import dsse, jcs, names
from relgate_trust.digests import is_digest, sha256_digest, spelled
from relgate_trust.errors import ManifestError, VerificationError
from relgate_trust.fstree import walk_checkpoint_tree, write_file_atomic

validate_name = names.validate_name
validate_relative_path = names.validate_relative_path

PAYLOAD_TYPE = "application/vnd.relgate.checkpoint.manifest.v1+json"
MEDIA_TYPE = PAYLOAD_TYPE
DEFAULT_CHUNK_SIZE = 64 * 1024 * 1024
DEFAULT_BLOCK_SIZE = 4 * 1024 * 1024
_DIGEST_EXCLUDED_KEYS = ("manifestId", "signatures")


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
        return jcs.dumps(self.to_json())

    @cached_property
    def digest(self) -> str:
        """Computed once: the manifest is immutable, and a 12,500-chunk one takes ~50 ms to
        canonicalize (the coordinator reads it on every Register)."""
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
    if not is_digest(v):
        raise ManifestError(f"not a sha256 digest: {v!r}")
    return v


def manifest_digest(doc: Mapping[str, Any]) -> str:
    """sha256:<hex> over RFC 8785 canonical JSON with manifestId and signatures removed."""
    body = {k: v for k, v in doc.items() if k not in _DIGEST_EXCLUDED_KEYS}
    return sha256_digest(jcs.dumps(body))


def crc32c(data: bytes | bytearray | memoryview) -> int:
    return int(google_crc32c.value(bytes(data)))


def chunk_digest(data: bytes | bytearray | memoryview) -> str:
    return sha256_digest(data)


# ---------------------------------------------------------------------------- build


def _list_files(root: Path) -> list[tuple[str, Path]]:
    """Regular files under root (the shared walker: symlinks, devices, FIFOs refused)."""
    return [(f.rel, f.path) for f in walk_checkpoint_tree(root)]


class _ChunkHasher:
    """SHA-256 per chunk and CRC32C per block over the concatenated byte space."""

    def __init__(self, chunk_size: int, block_size: int) -> None:
        self.chunk_size, self.block_size = chunk_size, block_size
        self.chunks: list[ChunkEntry] = []
        self.sha = hashlib.sha256()
        self.crcs: list[int] = []
        self.block_buf = bytearray()
        self.chunk_fill = 0

    def room(self) -> int:
        return self.block_size - len(self.block_buf)

    def feed(self, data: bytes) -> None:
        """At most :meth:`room` bytes: they never cross a block boundary."""
        self.block_buf += data
        self.sha.update(data)
        self.chunk_fill += len(data)
        if len(self.block_buf) == self.block_size:
            self._finish_block()
            if self.chunk_fill == self.chunk_size:
                self._finish_chunk()

    def finish(self) -> list[ChunkEntry]:
        if self.block_buf:
            self._finish_block()
        if self.chunk_fill:
            self._finish_chunk()
        return self.chunks

    def _finish_block(self) -> None:
        self.crcs.append(crc32c(self.block_buf))
        self.block_buf.clear()

    def _finish_chunk(self) -> None:
        idx = len(self.chunks)
        self.chunks.append(
            ChunkEntry(
                idx,
                idx * self.chunk_size,
                self.chunk_fill,
                spelled(self.sha.hexdigest()),
                tuple(self.crcs),
            )
        )
        self.sha = hashlib.sha256()
        self.crcs = []
        self.chunk_fill = 0


def _hash_chunks(paths: list[Path], chunk_size: int, block_size: int) -> list[ChunkEntry]:
    hasher = _ChunkHasher(chunk_size, block_size)
    for p in paths:
        with open(p, "rb") as fh:
            while data := fh.read(hasher.room()):
                hasher.feed(data)
    return hasher.finish()


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

    chunks = _hash_chunks([p for _rel, p in listed], chunk_size, block_size)
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
    return dsse.keyid_of(public_key)


def generate_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def public_key_pem(public_key: Ed25519PublicKey) -> bytes:
    """PEM SubjectPublicKeyInfo, the form trusted-key directories hold."""
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def write_keypair(private_key: Ed25519PrivateKey, private_path: Path, public_path: Path) -> None:
    """PEM SubjectPublicKeyInfo public key, then PEM PKCS8 private key (mode 0600), each
    written atomically (parent directories created); the private key is the commit point."""
    pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_file_atomic(Path(public_path), public_key_pem(private_key.public_key()), 0o644)
    write_file_atomic(Path(private_path), pem, 0o600)


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise VerificationError(f"{path} is not an Ed25519 private key")
    return key


# ---------------------------------------------------------------------------- DSSE
#
# The envelope format, its strict parser and the trusted key set live in relgate_trust.dsse,
# shared with the main package.  Checkpoint manifests verify only under a key of a role
# dsse.PAYLOAD_ROLES names for them (the builder), like every other signed document: a
# trusted PEM not named ``builder-v<N>[-...].pem`` (an unroled key) is refused (key-role).

TrustedKeys = dsse.TrustedKeys
pae = dsse.pae
SIGNER_ROLES: tuple[dsse.Role, ...] = tuple(sorted(dsse.roles_for(PAYLOAD_TYPE)))


def sign_manifest(
    manifest: CheckpointManifest, private_key: Ed25519PrivateKey | dsse.Signer
) -> dict[str, Any]:
    """A DSSE envelope over the manifest's canonical JSON.

    A bare private key (what ``relgate-agent manifest build --key`` reads) does not know its
    version: its signature carries no ``keyVersion`` and verifies by keyid under whatever
    version the trusted file name gives (the role check still applies)."""
    signer = private_key if isinstance(private_key, dsse.Signer) else dsse.Signer(private_key)
    envelope = dsse.sign(PAYLOAD_TYPE, manifest.canonical_bytes(), signer)
    if not isinstance(private_key, dsse.Signer):
        del envelope["signatures"][0]["keyVersion"]  # version unknown: a bare key
    return envelope


def envelope_bytes(envelope: Mapping[str, Any]) -> bytes:
    return dsse.envelope_bytes(envelope)


def verify_envelope(
    envelope: Mapping[str, Any] | bytes | str,
    trusted_keys: TrustedKeys | Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
) -> CheckpointManifest:
    """Verify a DSSE envelope against an explicit trusted key set and return the manifest.

    Refuses (raises :class:`relgate_trust.dsse.DsseError`, a VerificationError naming the
    check) when unsigned, signed only by unknown, revoked or wrong-role keys, when a signature
    does not verify, or when the payload is not strict canonical JSON; a well-formed payload
    that is not a consistent manifest raises VerificationError.
    """
    if not isinstance(trusted_keys, TrustedKeys):
        trusted_keys = TrustedKeys.load(trusted_keys)
    verified = dsse.verify(
        envelope,
        trusted_keys,
        payload_type=PAYLOAD_TYPE,
        roles=SIGNER_ROLES,
        subject="checkpoint manifest",
    )
    if not isinstance(verified.body, dict):
        raise dsse.DsseError(
            "signed payload is not a JSON object",
            check="payload-json",
            subject="checkpoint manifest",
        )
    try:
        return CheckpointManifest.from_json(verified.body)
    except ManifestError as exc:
        raise VerificationError(f"signed manifest is invalid: {exc}") from exc


def write_envelope(envelope: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    Path(path).write_bytes(envelope_bytes(envelope))
