"""The check names a transform refusal carries (each spelled once, imported where used)."""

from __future__ import annotations

from typing import Final

#: The pinned artifact's bytes (or the code here) do not hash to the pinned digest.
DIGEST: Final = "transform-digest"
#: A tag that is not ``repository/name:tag`` or not registered.
TAG: Final = "transform-tag"
#: A reference that is not ``repository/name@sha256:...``.
REF: Final = "transform-ref"
#: A built-in transform name this code does not have.
KNOWN: Final = "transform-known"
#: A wheel that is not a well-formed wheel (zip, METADATA, name/version, paths).
PACKAGE: Final = "transform-package"
#: An OCI image layout, index, manifest or config that is malformed.
IMAGE: Final = "transform-image"
#: An archive member that would escape its directory (``..``, absolute, links, devices).
UNPACK: Final = "transform-unpack"
#: The transform process exited non-zero (or crashed).
EXIT: Final = "transform-exit"
#: The transform process ran past its time limit and was killed.
TIMEOUT: Final = "transform-timeout"
#: The output is not a readable Arrow IPC file or stream (or is too large).
OUTPUT: Final = "transform-output"
#: The output schema is not exactly the input schema.
SCHEMA: Final = "transform-schema"
#: The output has more rows than the input.
ROWS: Final = "transform-rows"
#: The output names a record (id, source, version) the input did not have.
INVENTED: Final = "transform-invented-id"
#: The output holds a record more often than the input did.
DUPLICATE: Final = "transform-duplicate-id"
#: A pin registered under a digest conflicts with what is already registered.
PIN: Final = "transform-pin"
