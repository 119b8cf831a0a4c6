"""Mark: every stored object one version references, read from its signed manifest.

A snapshot references its DSSE envelope, its membership table, the CAS documents that pin
its sources (and, when raw sources are retained, the raw objects those documents list), the
artifacts it pins (a tokenizer, a transform's wheel or image) and its stored reports.  A release references its envelope, every shard descriptor's exact
object version, its snapshot's membership table, and its verification reports and
provenance.  Any referenced manifest that is missing or does not verify is an error that
names it: the collector never guesses what an unreadable manifest referenced.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from relgate.catalog.db import rows
from relgate.catalog.versions import verified_bytes
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.documents.verified_bytes import Verification, VerifiedBytes, open_stored
from relgate.errors import RejectedError, RelgateError
from relgate.objects.layout import (
    MANAGED_PREFIXES,
    canonical_key,
    cas_key,
    release_envelope_key,
    shard_key,
    snapshot_envelope_key,
)
from relgate.workspace import Workspace

#: A raw-object entry of a pin document is ``[key, version, ...]``.
_KEY_AND_VERSION = 2

__all__ = [
    "MANAGED_PREFIXES",
    "Ref",
    "Verified",
    "VersionRow",
    "cas_refs",
    "descriptor_key",
    "refs_of",
    "version_refs",
    "version_rows",
]


@dataclass(frozen=True)
class Ref:
    key: str  # canonical
    version_id: str
    role: str
    subject: str  # the version (digest) that references it

    @property
    def name(self) -> str:
        return f"{self.key}@{self.version_id}"

    @property
    def managed(self) -> bool:
        return self.key.startswith(MANAGED_PREFIXES)


def descriptor_key(descriptor: Any) -> str:
    """The canonical key of the shard a release's descriptor names."""
    encrypted = descriptor["mediaType"] == rm.ENCRYPTED_SHARD_MEDIA_TYPE
    return canonical_key(shard_key(str(descriptor["digest"]), encrypted=encrypted))


def cas_refs(node: Any) -> Iterator[tuple[str, str]]:
    """Every ``{"uri": "cas://...", "objectVersion": ...}`` inside a source entry."""
    if isinstance(node, dict):
        uri, version = node.get("uri"), node.get("objectVersion")
        if isinstance(uri, str) and uri.startswith("cas://") and isinstance(version, str):
            yield uri, version
        for value in node.values():
            yield from cas_refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from cas_refs(value)


def _unreadable(kind: str, key: str, version: str, digest: str, exc: RelgateError) -> RejectedError:
    return RejectedError(
        f"retained {kind} manifest is missing or unreadable ({exc.check or exc.code});"
        " garbage collection fails closed",
        object=f"{key}@{version}",
        check="retained-manifest",
        digest=digest,
        details={"cause": exc.message},
    )


@dataclass(frozen=True)
class VersionRow:
    """What mark reads from the catalog for one version: its row and its reports."""

    envelope_version: str
    members_digest: str
    members_version: str
    reports: tuple[tuple[str, str, str], ...]  # (subject_kind, report_digest, report_version)
    #: the stored envelope's verified bytes (None: not verified yet)
    verified: VerifiedBytes | None = None


_COLUMNS = (
    "digest, envelope_version, members_digest, members_version, verified_sha256, verified_trust"
)
_ROWS_SQL = {
    "snapshot": f"SELECT {_COLUMNS} FROM snapshots",  # noqa: S608 constant column names
    "release": f"SELECT {_COLUMNS} FROM releases",  # noqa: S608 constant column names
}
#: Digests per ``IN (...)`` list when rows are read for many versions at once.
ROW_CHUNK = 500


def version_rows(conn: Connection, kind: str, digests: Sequence[str]) -> dict[str, VersionRow]:
    """The catalog rows (and reports) of many versions of ``kind``, a few queries in all."""
    out: dict[str, VersionRow] = {}
    for start in range(0, len(digests), ROW_CHUNK):
        chunk = list(digests[start : start + ROW_CHUNK])
        marks = ", ".join(f":d{i}" for i in range(len(chunk)))
        params = {f"d{i}": d for i, d in enumerate(chunk)}
        reports: dict[str, list[tuple[str, str, str]]] = {d: [] for d in chunk}
        for row in rows(
            conn,
            "SELECT subject_digest, subject_kind, report_digest, report_version FROM reports"  # noqa: S608 bind-parameter names only
            f" WHERE subject_digest IN ({marks}) ORDER BY id",
            params,
        ):
            reports[row["subject_digest"]].append(
                (row["subject_kind"], row["report_digest"], row["report_version"])
            )
        for row in rows(conn, f"{_ROWS_SQL[kind]} WHERE digest IN ({marks})", params):
            out[row["digest"]] = VersionRow(
                row["envelope_version"],
                row["members_digest"],
                row["members_version"],
                tuple(reports[row["digest"]]),
                verified_bytes(row["verified_sha256"], row["verified_trust"]),
            )
    return out


def _report_refs(row: VersionRow, digest: str) -> list[Ref]:
    out = []
    for subject_kind, report_digest, report_version in row.reports:
        role = "provenance" if subject_kind.endswith("provenance") else "report"
        out.append(Ref(cas_key(report_digest), report_version, role, digest))
    return out


def _no_row(kind: str, digest: str) -> RejectedError:
    return RejectedError(
        f"retained {kind} has no catalog row", object=kind, check="exists", digest=digest
    )


#: Where the envelopes a reader verified in full are collected, to be recorded on their rows.
Verified = list[Verification]


def _opened(ws: Workspace, kind: str, digest: str, row: VersionRow, verified: Verified) -> Any:
    """The version's signed document: recognised by the bytes its row recorded, or
    verified in full (and added to ``verified``)."""
    opened = open_stored(
        ws.store, ws.trusted_keys, kind, digest, row.envelope_version, row.verified
    )
    if opened.verification is not None:
        verified.append(opened.verification)
    return opened.body


def snapshot_refs(
    ws: Workspace,
    row: VersionRow | None,
    digest: str,
    *,
    raw_sources: bool = False,
    verified: Verified | None = None,
) -> list[Ref]:
    if row is None:
        raise _no_row("snapshot", digest)
    key = snapshot_envelope_key(digest)
    try:
        body = _opened(ws, "snapshot", digest, row, [] if verified is None else verified)
        manifest = sm.from_payload(body, subject=key)
    except RelgateError as exc:
        raise _unreadable("snapshot", key, row.envelope_version, digest, exc) from None
    out = [Ref(key, row.envelope_version, "manifest", digest)]
    members = manifest.members_ref
    out.append(Ref(members.key, members.version_id, "members", digest))
    if (members.digest, members.version_id) != (row.members_digest, row.members_version):
        out.append(Ref(cas_key(row.members_digest), row.members_version, "members", digest))
    for uri, version in cas_refs(manifest.body.get("sources", [])):
        out.append(Ref(canonical_key(uri), version, "source-pin", digest))
        if raw_sources:
            out.extend(_raw_refs(ws, canonical_key(uri), version, digest))
    for artifact in manifest.artifacts or ():  # tokenizer, transform artifact, ...
        out.append(Ref(artifact.content_ref.key, artifact.object_version, artifact.role, digest))
    for uri, version in cas_refs(manifest.body.get("statistics")):
        out.append(Ref(canonical_key(uri), version, "statistics", digest))
    out.extend(_report_refs(row, digest))
    return out


def _raw_refs(ws: Workspace, key: str, version: str, digest: str) -> list[Ref]:
    """Raw objects an object-prefix pin document lists (audit and reconstruction)."""
    try:
        doc = json.loads(ws.store.get(key, version))
    except (RelgateError, ValueError):
        return []  # the pin document itself is checked as a required object
    if not isinstance(doc, dict) or not isinstance(doc.get("objects"), list):
        return []
    return [
        Ref(canonical_key(str(entry[0])), str(entry[1]), "raw-source", digest)
        for entry in doc["objects"]
        if isinstance(entry, list) and len(entry) >= _KEY_AND_VERSION
    ]


def release_refs(
    ws: Workspace, row: VersionRow | None, digest: str, *, verified: Verified | None = None
) -> list[Ref]:
    if row is None:
        raise _no_row("release", digest)
    key = release_envelope_key(digest)
    try:
        document = _opened(ws, "release", digest, row, [] if verified is None else verified)
        shards = [
            Ref(descriptor_key(d), str(d["objectVersion"]), "shard", digest)
            for d in rm.wire_shards(document)
        ]
    except RelgateError as exc:
        raise _unreadable("release", key, row.envelope_version, digest, exc) from None
    except (KeyError, TypeError) as exc:
        raise RejectedError(
            "retained release manifest has a malformed shard descriptor",
            object=f"{key}@{row.envelope_version}",
            check="retained-manifest",
            digest=digest,
            details={"cause": type(exc).__name__},
        ) from None
    out = [Ref(key, row.envelope_version, "manifest", digest), *shards]
    out.append(Ref(cas_key(row.members_digest), row.members_version, "members", digest))
    out.extend(_report_refs(row, digest))
    return out


def refs_of(
    ws: Workspace,
    kind: str,
    digest: str,
    row: VersionRow | None,
    *,
    raw_sources: bool = False,
    verified: Verified | None = None,
) -> list[Ref]:
    """The references of one version whose catalog row was read already; an envelope
    verified in full (no record yet, or other trusted keys) is added to ``verified``."""
    if kind == "release":
        return release_refs(ws, row, digest, verified=verified)
    return snapshot_refs(ws, row, digest, raw_sources=raw_sources, verified=verified)


def version_refs(
    ws: Workspace, conn: Connection, kind: str, digest: str, *, raw_sources: bool = False
) -> list[Ref]:
    row = version_rows(conn, kind, [digest]).get(digest)
    return refs_of(ws, kind, digest, row, raw_sources=raw_sources)
