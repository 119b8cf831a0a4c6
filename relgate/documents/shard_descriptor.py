"""The shard descriptor: one OCI-style entry of a release root per stored shard.

``mediaType``, ``digest`` and ``size`` of the stored bytes, the pinned ``objectVersion``,
the ``logicalDigest`` of the decoded canonical record stream, ``records``, ``tokens`` and
the ``memberSetDigest``.  :class:`ShardDescriptor` is the typed contract; the verifier
still inspects the descriptors of a signed root as they were signed
(:func:`descriptor_problems`), because a malformed descriptor is one of its findings, not
a reason to stop.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import Field, StrictStr
from relgate_trust.digests import is_digest

from relgate.integrity.contract import Contract, JsonValue
from relgate.objects.layout import release_shard_key

SHARD_MEDIA_TYPE = "application/vnd.apache.parquet"
ENCRYPTED_SHARD_MEDIA_TYPE = "application/vnd.relgate.parquet+aes256gcm"
MEDIA_TYPES = (SHARD_MEDIA_TYPE, ENCRYPTED_SHARD_MEDIA_TYPE)

DESCRIPTOR_FIELDS = (
    "id",
    "mediaType",
    "digest",
    "size",
    "objectVersion",
    "logicalDigest",
    "records",
    "tokens",
    "memberSetDigest",
)
_DIGEST_FIELDS = ("digest", "logicalDigest", "memberSetDigest")
_DESCRIPTOR_TYPES: dict[str, type] = {
    "id": str,
    "mediaType": str,
    "digest": str,
    "size": int,
    "objectVersion": str,
    "logicalDigest": str,
    "records": int,
    "tokens": int,
    "memberSetDigest": str,
}
_SHARD_ID = re.compile(r"shard-([0-9]{5,})-of-([0-9]{5,})")


class ShardDescriptor(Contract):
    """One shard of a release, as the signed root describes it."""

    id: StrictStr
    media_type: StrictStr
    #: ``digest`` on the wire (the name ``digest`` is the contract's own digest method).
    storage_digest: StrictStr = Field(alias="digest")
    size: int  # lax like the checks before it: a bool is counted mistyped, still read
    object_version: StrictStr
    logical_digest: StrictStr
    records: int
    tokens: int
    member_set_digest: StrictStr

    @property
    def encrypted(self) -> bool:
        return self.media_type == ENCRYPTED_SHARD_MEDIA_TYPE

    @property
    def object_key(self) -> str:
        """The key its stored bytes live under (addressed by their digest, never listed)."""
        return release_shard_key(self.storage_digest, encrypted=self.encrypted)


def well_formed(value: JsonValue) -> bool:
    """Every field present with its type and a well-formed storage digest.

    Only such descriptors are handed to the per-shard checks; the others are counted by
    :func:`descriptor_problems`.
    """
    return (
        isinstance(value, dict)
        and all(f in value for f in DESCRIPTOR_FIELDS)
        and all(isinstance(value[f], t) for f, t in _DESCRIPTOR_TYPES.items())
        and _is_digest(value["digest"])
    )


def _is_digest(value: JsonValue) -> bool:
    return isinstance(value, str) and is_digest(value)


def descriptor_problems(shards: JsonValue, total: JsonValue) -> list[str]:
    """Every descriptor must carry every field with the right type, ids well formed."""
    if not isinstance(shards, list):
        return ["shards is not a list"]
    problems: list[str] = []
    seen: set[str] = set()
    for index, d in enumerate(shards):
        if not isinstance(d, dict):
            problems.append(f"descriptor {index} is not an object")
            continue
        problem = _field_problem(index, d)
        if problem is not None:
            problems.append(problem)
            continue
        ident = str(d["id"])
        m = _SHARD_ID.fullmatch(ident)
        if not m or int(m.group(1)) != index or int(m.group(2)) != total:
            problems.append(
                f"descriptor {index} has id {ident!r}, expected position {index} of {total}"
            )
        if ident in seen:
            problems.append(f"descriptor id {ident!r} repeats")
        seen.add(ident)
        if d["mediaType"] not in MEDIA_TYPES:
            problems.append(f"descriptor {index} has unknown mediaType")
    return problems


def _field_problem(index: int, d: Mapping[str, JsonValue]) -> str | None:
    missing = [f for f in DESCRIPTOR_FIELDS if f not in d]
    if missing:
        return f"descriptor {index} lacks {missing}"
    wrong = [
        f
        for f, t in _DESCRIPTOR_TYPES.items()
        if not isinstance(d[f], t) or (t is int and isinstance(d[f], bool))
    ]
    if wrong:
        return f"descriptor {index} has mistyped {wrong}"
    bad_digest = [f for f in _DIGEST_FIELDS if not _is_digest(d[f])]
    if bad_digest:
        return f"descriptor {index} has malformed {bad_digest}"
    return None
