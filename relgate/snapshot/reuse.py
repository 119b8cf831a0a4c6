"""Re-running a build on unchanged input reuses the snapshot it already built.

A snapshot's digest covers its build id and times, so two builds of the same input are
two digests.  What a build depends on is all in its manifest: the pinned sources, both
fence watermarks, the pinned transform, the record schema, the selection and split
policies and the purpose (the parent is the alias's active snapshot itself).  When the
alias's active snapshot was built from exactly these :class:`BuildInputs`, the build is a
no-op that reports that digest; any difference builds a new snapshot.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any

from relgate.catalog.snapshot_table import get_snapshot
from relgate.documents import snapshot_manifest as mf
from relgate.documents.source_pins import SourceEntry
from relgate.documents.transform_spec import TransformSpec
from relgate.errors import IntegrityError
from relgate.records.record_schema import RecordSchema
from relgate.workspace import Workspace

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildInputs:
    """Everything a snapshot build's membership depends on (named as the manifest's
    fields: a new build's body is made from these, an old one's are read back)."""

    sources: tuple[SourceEntry, ...]
    tombstone_watermark: int
    benchmark_fence: int
    transform_image: str
    transform: TransformSpec
    record_schema_document: RecordSchema
    selection_policy: str
    split_policy: str
    purpose: str

    def body(self, **built: Any) -> mf.SnapshotBody:
        """The manifest body of these inputs and what the build made of them (``built``:
        the rest of :class:`relgate.documents.snapshot_manifest.SnapshotBody`)."""
        return mf.SnapshotBody(**{f.name: getattr(self, f.name) for f in fields(self)}, **built)

    @classmethod
    def of_manifest(cls, manifest: mf.SnapshotManifest) -> BuildInputs:
        values = {f.name: getattr(manifest, f.name) for f in fields(cls)}
        return cls(**{**values, "sources": tuple(values["sources"])})


def built_from(ws: Workspace, digest: str, inputs: BuildInputs) -> mf.SnapshotManifest | None:
    """The manifest of snapshot ``digest`` (opened and verified) if it was built from
    exactly ``inputs``, is ACTIVE and its stored membership table still hashes to its
    digest; None otherwise."""
    row = get_snapshot(ws.db, digest)
    if row.state != "ACTIVE":
        return None
    manifest = mf.load(ws.store, ws.trusted_keys, digest, row.envelope_version)
    if BuildInputs.of_manifest(manifest) != inputs:
        return None
    try:  # reused content is re-hashed from the exact stored version it names
        ws.membership.path(manifest.members_ref, from_store=True)
    except IntegrityError as exc:
        _log.warning("not reusing snapshot %s: %s", digest, exc)
        return None  # rebuilt; the builder writes a new version of the same content
    return manifest
