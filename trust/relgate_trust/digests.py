"""The digest spelling both products use: ``sha256:<64 lowercase hex>``, everywhere."""

from __future__ import annotations

import hashlib
import io
import re
from typing import Final, TypeGuard

PREFIX: Final = "sha256:"
#: The length of a spelled digest.
LENGTH: Final = len(PREFIX) + 64
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


def sha256_digest(data: bytes | bytearray | memoryview) -> str:
    """The spelled SHA-256 digest of ``data``."""
    return spelled(hashlib.sha256(data).hexdigest())


def file_sha256_digest(fh: io.BufferedReader) -> str:
    """The spelled SHA-256 digest of an open binary file, read in chunks from its position
    (never held in memory)."""
    return spelled(hashlib.file_digest(fh, "sha256").hexdigest())


def spelled(hexdigest: str) -> str:
    """A SHA-256 hex digest (an incremental hasher's ``hexdigest()``) spelled as a digest."""
    return PREFIX + hexdigest


def is_digest(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a spelled digest (a string, the prefix, 64 lowercase hex)."""
    return isinstance(value, str) and _DIGEST_RE.fullmatch(value) is not None
