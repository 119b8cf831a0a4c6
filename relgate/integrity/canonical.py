"""RFC 8785 canonical JSON and manifest digests.

Manifests hold integers, strings, booleans, null, lists and objects only: a float has no
single canonical spelling across implementations, so it is refused before encoding (the
same bounds the shared envelope parser, :mod:`relgate_trust.dsse`, enforces on verification).
The digest of a manifest excludes its own identity and transport fields
(``snapshotId``/``rootId``/``manifestId``, ``signatures``, ``transport``) so it can be
recomputed from the manifest without self-reference.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from relgate_trust import jcs
from relgate_trust.digests import sha256_digest
from relgate_trust.dsse import MAX_SAFE_INTEGER

from relgate.errors import UsageError

#: Fields that never take part in a manifest's digest.
DIGEST_EXCLUDED = frozenset({"snapshotId", "rootId", "manifestId", "signatures", "transport"})


def _check(value: Any, path: str) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise UsageError(
                "integer outside the interoperable JSON range", object=path, check="no-big-int"
            )
        return
    if isinstance(value, float):
        raise UsageError(
            "manifests hold integers and strings only, not floats", object=path, check="no-float"
        )
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise UsageError("object keys must be strings", object=path, check="key-type")
            _check(item, f"{path}.{key}")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]")
        return
    raise UsageError(
        f"unsupported JSON type {type(value).__name__}", object=path, check="json-type"
    )


def canonical_bytes(value: Any) -> bytes:  # a JSON boundary: _check types it
    """RFC 8785 bytes of a JSON value (floats and unsafe integers refused)."""
    _check(value, "$")
    encoded: bytes = jcs.dumps(value)
    return encoded


def digest_payload(
    manifest: Mapping[str, object], excluded: Iterable[str] = DIGEST_EXCLUDED
) -> dict[str, object]:
    """The manifest without its identity and transport fields."""
    drop = set(excluded)
    return {k: v for k, v in manifest.items() if k not in drop}


def manifest_digest(manifest: Mapping[str, object]) -> str:
    """``sha256:`` of the canonical bytes of :func:`digest_payload`."""
    return sha256_digest(canonical_bytes(digest_payload(manifest)))
