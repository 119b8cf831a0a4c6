"""Re-verify a placed copy against its signed manifest; un-place it on any mismatch.

One procedure for ``relgate-agent verify MODEL VERSION`` and for a quarantined host, which
re-verifies every version it holds: the copy must be placed, carry the signed manifest it
was placed from (verified against the host's trusted keys), a marker naming that manifest,
exactly the manifest's files (no symlinks, right sizes) and every chunk's SHA-256.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from relgate_trust.errors import ManifestError
from relgate_trust.fstree import UnsafePathError
from relgate_trust.manifest import TrustedKeys, validate_name, verify_envelope

from relgate_agent.staging.storage import (
    CHECK_CHUNK_DIGEST,
    CHECK_NOT_PLACED,
    CHECK_PLACED_MANIFEST,
    CHECK_PLACED_MARKER,
    VersionStore,
    held_versions,
    read_placed_envelope,
    read_placed_marker,
    scrub_placed,
    unplace,
)


@dataclass(frozen=True)
class PlacedCheck:
    """The outcome for one placed copy: intact, or the check it failed (with its details)."""

    obj: str  # model/version
    intact: bool
    check: str = ""
    message: str = ""
    details: Mapping[str, object] = field(default_factory=dict)  # camelCase, as emitted

    def to_json(self) -> dict[str, object]:
        if self.intact:
            return {"object": self.obj, "intact": True, **self.details}
        return {
            "error": "rejected",
            "object": self.obj,
            "check": self.check,
            "message": self.message,
            **self.details,
        }

    def summary(self) -> str:
        if self.intact:
            return f"{self.obj} intact"
        unplaced = " (unplaced)" if self.details.get("unplaced") else ""
        return f"{self.obj} {self.check}{unplaced}"


def reverify_placed(
    root: Path, model: str, version: str, trusted: TrustedKeys, *, keep: bool = False
) -> PlacedCheck:
    """Re-verify ``root/model/version``; unless ``keep``, a copy whose bytes or file set do
    not match is un-placed. A bad manifest signature raises (VerificationError)."""
    model, version = validate_name("model", model), validate_name("version", version)
    obj = f"{model}/{version}"
    if not VersionStore.is_placed(root, model, version):
        return PlacedCheck(
            obj, False, CHECK_NOT_PLACED, f"{root / model / version} is not a placed copy"
        )
    envelope = read_placed_envelope(root, model, version)
    if envelope is None:
        why = "no signed manifest recorded beside the placed copy"
        return PlacedCheck(obj, False, CHECK_PLACED_MANIFEST, why)
    manifest = verify_envelope(envelope, trusted)
    marker = read_placed_marker(root, model, version)
    if (manifest.model, manifest.version) != (model, version) or marker != manifest.digest:
        why = f"placed marker {marker!r} does not record manifest {manifest.digest}"
        return PlacedCheck(obj, False, CHECK_PLACED_MARKER, why, {"digest": manifest.digest})
    try:
        result = scrub_placed(root, manifest)
    except UnsafePathError as exc:
        if not keep:
            unplace(root, model, version)
        details = {"path": exc.path, "digest": manifest.digest, "unplaced": not keep}
        return PlacedCheck(obj, False, exc.check, str(exc), details)
    if result.intact:
        details = {
            "manifestDigest": manifest.digest,
            "chunks": result.chunks,
            "path": str(root / model / version),
        }
        return PlacedCheck(obj, True, details=details)
    if not keep:
        unplace(root, model, version)
    chunk = result.bad_chunks[0]
    return PlacedCheck(
        obj,
        False,
        CHECK_CHUNK_DIGEST,
        f"chunk {chunk} of {', '.join(result.files_of_first_bad)} does not match the manifest "
        f"(expected {result.expected_digest}, got {result.actual_digest})",
        {
            "chunk": chunk,
            "file": result.files_of_first_bad[0],
            "files": list(result.files_of_first_bad),
            "expected": result.expected_digest,
            "actual": result.actual_digest,
            "badChunks": list(result.bad_chunks),
            "digest": manifest.digest,
            "unplaced": not keep,
        },
    )


def reverify_all(root: Path, trusted: TrustedKeys) -> list[PlacedCheck]:
    """Every placed version under ``root``, re-verified (mismatches un-placed)."""
    out = []
    for held in held_versions(root):
        model, _, version = held.partition("/")
        try:
            out.append(reverify_placed(root, model, version, trusted))
        except ManifestError as exc:  # a bad name or signature: nothing here vouches for it
            out.append(PlacedCheck(held, False, getattr(exc, "check", "manifest"), str(exc)))
    return out


__all__ = ["PlacedCheck", "reverify_all", "reverify_placed"]
