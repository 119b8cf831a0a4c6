"""Member tuples and their injective length-prefixed encoding.

A member tuple is ``(sampleId, sourceId, sourceVersion, logicalContentDigest, split,
schemaDigest)``.  Each field is encoded as a 4-byte big-endian length followed by its
UTF-8 bytes, so no choice of field values can make two different tuples encode alike
(a delimiter-joined string could).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from pydantic import StrictStr

from relgate.errors import IntegrityError
from relgate.integrity.contract import Contract

#: Wire names of the fields, in encoding order.
FIELDS = ("sampleId", "sourceId", "sourceVersion", "logicalContentDigest", "split", "schemaDigest")
_NAMES = (
    "sample_id",
    "source_id",
    "source_version",
    "logical_content_digest",
    "split",
    "schema_digest",
)
_LEN = struct.Struct(">I")


class MemberTuple(Contract):
    """One member of a snapshot as the Merkle tree commits to it.

    Built positionally in encoding order (``MemberTuple(sample, source, ...)``) or by name;
    ordered like the tuple of its fields, so a sorted list of tuples is sorted by sampleId.
    """

    sample_id: StrictStr
    source_id: StrictStr
    source_version: StrictStr
    logical_content_digest: StrictStr
    split: StrictStr
    schema_digest: StrictStr

    def __init__(self, *values: str, **fields: str) -> None:
        if values:
            if len(values) != len(_NAMES):
                raise TypeError(f"MemberTuple takes {len(_NAMES)} fields, got {len(values)}")
            fields = dict(zip(_NAMES, values, strict=True)) | fields
        super().__init__(**fields)

    def values(self) -> tuple[str, ...]:
        """The fields in encoding order."""
        return (
            self.sample_id,
            self.source_id,
            self.source_version,
            self.logical_content_digest,
            self.split,
            self.schema_digest,
        )

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MemberTuple):
            return NotImplemented
        return self.values() < other.values()

    def encode(self) -> bytes:
        return encode_fields(self.values())


def encode_fields(fields: Sequence[str]) -> bytes:
    out = bytearray()
    for value in fields:
        raw = value.encode("utf-8")
        out += _LEN.pack(len(raw))
        out += raw
    return bytes(out)


def decode_tuple(data: bytes) -> MemberTuple:
    values: list[str] = []
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise IntegrityError(
                "truncated length prefix", object="member-tuple", check="tuple-encoding"
            )
        (length,) = _LEN.unpack_from(data, pos)
        pos += 4
        if pos + length > len(data):
            raise IntegrityError("truncated field", object="member-tuple", check="tuple-encoding")
        values.append(data[pos : pos + length].decode("utf-8"))
        pos += length
    if len(values) != len(FIELDS):
        raise IntegrityError(
            f"member tuple has {len(values)} fields, expected {len(FIELDS)}",
            object="member-tuple",
            check="tuple-encoding",
        )
    return MemberTuple(*values)
