"""Digest strings: ``sha256:<64 lowercase hex>``, everywhere."""

from __future__ import annotations

import hashlib
import re

from relgate.errors import UsageError

_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_digest(value: str) -> bool:
    return bool(_DIGEST_RE.match(value))


def require_digest(value: str, *, what: str = "digest") -> str:
    if not isinstance(value, str) or not _DIGEST_RE.match(value):
        raise UsageError(
            f"{what} must look like sha256:<64 lowercase hex>",
            object=repr(value),
            check="digest-syntax",
        )
    return value


def hex_of(digest: str) -> str:
    return require_digest(digest)[len("sha256:") :]
