"""The ``verify`` command: scrub a placed copy against its signed manifest."""

from __future__ import annotations

from pathlib import Path

import click

from relgate_agent.cli.params import common, output

EXIT_OK, EXIT_REJECTED = 0, 3


def _refuse(obj: str, check: str, message: str, **extra: object) -> int:
    output().emit({"error": "rejected", "object": obj, "check": check, "message": message, **extra})
    return EXIT_REJECTED


@click.command(
    "verify", help="scrub a placed copy against its signed manifest; un-place on mismatch"
)
@common
@click.argument("model")
@click.argument("version")
@click.option("--models-root", default="/models")
@click.option("--trusted-keys", required=True, multiple=True)
@click.option("--keep", is_flag=True, help="report a mismatch but do not un-place")
def verify(
    model: str, version: str, models_root: str, trusted_keys: tuple[str, ...], keep: bool
) -> int:
    """Scrub a placed copy against its signed manifest; un-place it on any mismatch."""
    from relgate_agent.fstree import UnsafePathError
    from relgate_agent.manifest import TrustedKeys, validate_name, verify_envelope
    from relgate_agent.storage import (
        CHECK_CHUNK_DIGEST,
        CHECK_NOT_PLACED,
        CHECK_PLACED_MANIFEST,
        CHECK_PLACED_MARKER,
        VersionStore,
        read_placed_envelope,
        read_placed_marker,
        scrub_placed,
        unplace,
    )

    root = Path(models_root)
    model, version = validate_name("model", model), validate_name("version", version)
    obj = f"{model}/{version}"
    if not VersionStore.is_placed(root, model, version):
        return _refuse(obj, CHECK_NOT_PLACED, f"{root / model / version} is not a placed copy")
    envelope = read_placed_envelope(root, model, version)
    if envelope is None:
        return _refuse(
            obj, CHECK_PLACED_MANIFEST, "no signed manifest recorded beside the placed copy"
        )
    manifest = verify_envelope(envelope, TrustedKeys.load(list(trusted_keys)))
    marker = read_placed_marker(root, model, version)
    if (manifest.model, manifest.version) != (model, version) or marker != manifest.digest:
        return _refuse(
            obj,
            CHECK_PLACED_MARKER,
            f"placed marker {marker!r} does not record manifest {manifest.digest}",
            digest=manifest.digest,
        )
    try:
        result = scrub_placed(root, manifest)
    except UnsafePathError as exc:
        if not keep:
            unplace(root, model, version)
        return _refuse(
            obj, exc.check, str(exc), path=exc.path, digest=manifest.digest, unplaced=not keep
        )
    if result.intact:
        output().emit(
            {
                "object": obj,
                "intact": True,
                "manifestDigest": manifest.digest,
                "chunks": result.chunks,
                "path": str(root / model / version),
            }
        )
        return EXIT_OK
    if not keep:
        unplace(root, model, version)
    chunk = result.bad_chunks[0]
    return _refuse(
        obj,
        CHECK_CHUNK_DIGEST,
        f"chunk {chunk} of {', '.join(result.files_of_first_bad)} does not match the manifest "
        f"(expected {result.expected_digest}, got {result.actual_digest})",
        chunk=chunk,
        file=result.files_of_first_bad[0],
        files=list(result.files_of_first_bad),
        expected=result.expected_digest,
        actual=result.actual_digest,
        badChunks=list(result.bad_chunks),
        digest=manifest.digest,
        unplaced=not keep,
    )
