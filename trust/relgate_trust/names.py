"""Names: the model, version and file-path rules every checkpoint path component obeys."""

from __future__ import annotations

import unicodedata

from relgate_trust.errors import ManifestError

_MAX_NAME_LEN = 255


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


__all__ = ["validate_name", "validate_relative_path"]
