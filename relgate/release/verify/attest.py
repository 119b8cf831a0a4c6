"""The in-toto/SLSA statement of a verified release (:class:`~relgate.integrity.statement.Statement`).

Subjects are the root manifest (``release-root``, the ``rootId``) and every shard by its
stored-bytes digest: approvers and permits name digests, never a mutable directory.  The
build definition records what the writer was asked to do (snapshot, watermarks, record
schema; sort seed, sharding function, compression, serializer and key version) and the one
material is the snapshot manifest by digest, whose own statement lists its pins.  The
verification report that admitted the release is a byproduct, so statement, report and
root are bound together.  The independent verifier issues it: it is signed with the
verifier key and the builder id names that key (``<namespace>/release-verifier/<keyid>``).
"""

from __future__ import annotations

import datetime as dt
import json

from relgate import __version__
from relgate.catalog.release_table import get_release
from relgate.documents import release_root as rm
from relgate.documents.snapshot_manifest import PAYLOAD_TYPE as SNAPSHOT_PAYLOAD_TYPE
from relgate.integrity.contract import JsonObject
from relgate.integrity.signing import Role, SigningKey
from relgate.integrity.statement import (
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    BuildDefinition,
    Builder,
    BuildMetadata,
    ResourceDescriptor,
    RunDetails,
    SlsaProvenance,
    Statement,
    VerifiedStatement,
    builder_id,
    sign_statement,
)
from relgate.snapshot.provenance import open_recorded
from relgate.workspace import Workspace

__all__ = [
    "BUILD_TYPE",
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "REPORT_KIND",
    "STATEMENT_TYPE",
    "release_statement",
    "sign_statement",
    "verify_provenance",
]

BUILD_TYPE = "https://relgate.dev/shard-release/writer/v1"
#: The builder kind in the builder id: the verifier that admitted the root issues it.
BUILDER_KIND = "release-verifier"
#: The catalog report kind (``reports.subject_kind``) of a release's statement.
REPORT_KIND = "release-provenance"
SUBJECT_ROOT = "release-root"
REPORT_MEDIA_TYPE = "application/vnd.relgate.release-verification.v1+json"


def subjects(root: rm.ReleaseRoot, root_digest: str) -> dict[str, str]:
    """Subject name -> digest: the root and every shard (by its id) at its stored digest."""
    out = {SUBJECT_ROOT: root_digest}
    out.update({d.id: d.storage_digest for d in root.shards})
    return out


def materials(root: rm.ReleaseRoot) -> list[ResourceDescriptor]:
    """What the writer consumed: the snapshot manifest (its statement lists the rest)."""
    snapshot = root.dataset_snapshot
    return [
        ResourceDescriptor.of(
            snapshot, uri=f"relgate-snapshot:{snapshot}", media_type=SNAPSHOT_PAYLOAD_TYPE
        )
    ]


def _subject_descriptors(root: rm.ReleaseRoot, root_digest: str) -> tuple[ResourceDescriptor, ...]:
    shards = [
        ResourceDescriptor.of(
            d.storage_digest,
            name=d.id,
            media_type=d.media_type,
            annotations={
                "objectVersion": d.object_version,
                "logicalDigest": d.logical_digest,
                "records": d.records,
            },
        )
        for d in root.shards
    ]
    head = ResourceDescriptor.of(root_digest, name=SUBJECT_ROOT, media_type=rm.PAYLOAD_TYPE)
    return (head, *shards)


def release_statement(
    root_digest: str, body: JsonObject, *, report_digest: str, keyid: str
) -> Statement:
    """The statement for a verified root, issued by the verifier key ``keyid``."""
    root = rm.ReleaseRoot.parse(body, what=f"release {root_digest}")
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Statement(
        subject=_subject_descriptors(root, root_digest),
        predicate=SlsaProvenance(
            build_definition=BuildDefinition(
                build_type=BUILD_TYPE,
                external_parameters={
                    "datasetSnapshot": root.dataset_snapshot,
                    "tombstoneWatermark": root.tombstone_watermark,
                    "benchmarkFence": root.benchmark_fence,
                    "recordSchema": root.record_schema,
                    "memberSchema": root.member_schema,
                },
                internal_parameters={"writer": root.writer.to_json()},
                resolved_dependencies=tuple(materials(root)),
            ),
            run_details=RunDetails(
                builder=Builder(
                    id=builder_id(BUILDER_KIND, keyid), version={"relgate": __version__}
                ),
                metadata=BuildMetadata(
                    invocation_id=f"verify:{report_digest}", started_on=now, finished_on=now
                ),
                byproducts=(
                    ResourceDescriptor.of(
                        report_digest, name="verification-report", media_type=REPORT_MEDIA_TYPE
                    ),
                ),
            ),
        ),
    )


def signed_statement(
    root_digest: str, body: JsonObject, *, report_digest: str, key: SigningKey
) -> bytes:
    """The stored bytes: the DSSE envelope of :func:`release_statement` signed by ``key``."""
    statement = release_statement(root_digest, body, report_digest=report_digest, keyid=key.keyid)
    return json.dumps(sign_statement(statement, key), sort_keys=True).encode()


def verify_provenance(ws: Workspace, root_digest: str) -> VerifiedStatement:
    """Open the recorded statement of a release: verifier-key signature, subjects equal to
    the root and every shard, every material with a digest and equal to the root's
    snapshot.  Any failure is exit 3 naming the object, the check and a digest."""
    row = get_release(ws.db, root_digest)
    root = rm.load(ws.store, ws.trusted_keys, root_digest, row.envelope_version)
    return open_recorded(
        ws,
        root_digest,
        report_kind=REPORT_KIND,
        role=Role.VERIFIER,
        kind=BUILDER_KIND,
        subjects=subjects(root, root_digest),
        materials=lambda: materials(root),
    )
