"""Tokenizers as pinned artifacts: trained or brought by the user, stored by digest.

A record schema that counts tokens with a tokenizer names the tokenizer's SHA-256; the
``tokenizers`` JSON file is stored content-addressed in the workspace store and every
snapshot that uses it lists it among its ``artifacts`` (so garbage collection keeps it
as long as the snapshot); registering it records its name (``tokenizers``), a root of the
sweep of its own.  Readers of the snapshot (the release writer, the independent
verifier) fetch it by the exact version the manifest names and check its digest before
counting with it (:func:`relgate.records.tokens.load_tokenizer`).  Nothing is
downloaded: the demo trains a small BPE tokenizer on its own corpus.
"""

from __future__ import annotations

from collections.abc import Iterable

from relgate_trust.digests import sha256_digest
from sqlalchemy import Connection
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from relgate.catalog.db import execute, utcnow
from relgate.documents import snapshot_manifest as mf
from relgate.errors import NotFoundError, RejectedError
from relgate.objects.cas import key_for
from relgate.objects.layout import cas_uri
from relgate.records.record_schema import RecordSchema
from relgate.records.tokens import TokenizerBytes, load_tokenizer
from relgate.workspace import Workspace

ROLE = "tokenizer"


def train(texts: Iterable[str], *, vocab_size: int = 2_000) -> bytes:
    """A byte-level BPE tokenizer trained on ``texts`` (deterministic for the same
    input), as its JSON bytes."""
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(iter(texts), trainer=trainer)
    return tokenizer.to_str().encode("utf-8")


def register(ws: Workspace, data: bytes) -> str:
    """Store a tokenizer JSON content-addressed (it must load); its digest."""
    digest = sha256_digest(data)
    load_tokenizer(digest, lambda _digest: data)  # refuses what does not load
    # The name first, inside the gate (ordered against sweep batches), then the bytes:
    # garbage collection keeps a registered tokenizer whether or not a snapshot uses it.
    with ws.db.gate_tx() as conn:
        record_tokenizer(conn, digest)
    ws.cas.put(data)
    return digest


def record_tokenizer(conn: Connection, digest: str) -> None:
    """Name a registered tokenizer (idempotent)."""
    execute(
        conn,
        "INSERT INTO tokenizers (digest, created_at) VALUES (:d, :t) ON CONFLICT (digest) DO NOTHING",
        {"d": digest, "t": utcnow()},
    )


def artifacts(ws: Workspace, records: RecordSchema) -> tuple[mf.ArtifactRef, ...]:
    """The artifacts a build with ``records`` must pin: the tokenizer, if it uses one,
    at its current stored version (checked against its digest)."""
    digest = records.tokens.tokenizer
    if digest is None:
        return ()
    try:
        version = ws.store.head(key_for(digest))
    except NotFoundError:
        raise RejectedError(
            "the record schema's tokenizer is not in the workspace store"
            " (relgate tokenizer register FILE)",
            object=ROLE,
            check="tokenizer-digest",
            digest=digest,
        ) from None
    data = ws.cas.get(digest, version.version_id)
    load_tokenizer(digest, lambda _digest: data)
    ref = mf.ArtifactRef(
        role=ROLE, uri=cas_uri(digest), object_version=version.version_id, size=len(data)
    )
    return (ref,)


def fetcher(ws: Workspace, manifest: mf.SnapshotManifest) -> TokenizerBytes | None:
    """Bytes of the tokenizer a snapshot pins, by the exact version it names."""
    if manifest.record_schema_document.tokens.tokenizer is None:
        return None

    def fetch(digest: str) -> bytes:
        ref = manifest.artifact(ROLE, digest)
        return ws.cas.get(digest, ref.object_version, size=ref.size)  # bounded by the manifest

    return fetch


def pinned_bytes(ws: Workspace, manifest: mf.SnapshotManifest) -> bytes | None:
    """The pinned tokenizer's bytes (digest-checked by the store read), if one is used:
    what a verifier hands its workers, so they need no store access of their own for it."""
    digest = manifest.record_schema_document.tokens.tokenizer
    fetch = fetcher(ws, manifest)
    return None if digest is None or fetch is None else fetch(digest)
