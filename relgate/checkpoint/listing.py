"""The listing of published checkpoint versions, each verified against the trusted keys."""

from __future__ import annotations

import json

from relgate_trust.manifest import TrustedKeys, verify_envelope

from relgate.checkpoint.location import ENVELOPE_NAME, checkpoint_root, validate_names, version_dir
from relgate.checkpoint.publish import PublishedCheckpoint, published_from_manifest
from relgate.integrity.contract import Contract
from relgate.workspace import Workspace


class CheckpointEntry(Contract):
    """One row of ``relgate checkpoint list``: a published version and its manifest."""

    model: str
    version: str
    manifest_digest: str
    manifest_uri: str


def _trusted(ws: Workspace) -> TrustedKeys:
    return TrustedKeys.load(ws.config["keys"]["trusted"])


def list_checkpoints(ws: Workspace) -> list[CheckpointEntry]:
    """Every published version, its envelope verified (a bad signature refuses the listing)."""
    trusted = _trusted(ws)
    out = []
    for env in sorted(checkpoint_root(ws).glob(f"*/*/{ENVELOPE_NAME}")):
        manifest = verify_envelope(json.loads(env.read_text()), trusted)
        out.append(
            CheckpointEntry(
                model=env.parent.parent.name,
                version=env.parent.name,
                manifest_digest=manifest.digest,
                manifest_uri=str(env),
            )
        )
    return out


def find_checkpoint(ws: Workspace, model: str, version: str) -> PublishedCheckpoint | None:
    """The published record of ``model/version`` (envelope verified), or None if unpublished."""
    validate_names(model, version)
    env = version_dir(ws, model, version) / ENVELOPE_NAME
    if not env.exists():
        return None
    return published_from_manifest(ws, verify_envelope(json.loads(env.read_text()), _trusted(ws)))
