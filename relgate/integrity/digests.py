"""Digest strings as the core refuses them: a value that is not ``sha256:<64 lowercase hex>``
is a usage error naming the field (the spelling itself is :mod:`relgate_trust.digests`)."""

from __future__ import annotations

from relgate_trust.digests import PREFIX, is_digest

from relgate.errors import UsageError


def require_digest(value: str, *, what: str = "digest") -> str:
    if not is_digest(value):
        raise UsageError(
            f"{what} must look like sha256:<64 lowercase hex>",
            object=repr(value),
            check="digest-syntax",
        )
    return value


def hex_of(digest: str) -> str:
    return require_digest(digest)[len(PREFIX) :]
