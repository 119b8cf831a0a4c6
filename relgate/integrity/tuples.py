"""Member tuples and their injective length-prefixed encoding.

A member tuple is ``(sampleId, sourceId, sourceVersion, logicalContentDigest, split,
schemaDigest)``.  Each field is encoded as a 4-byte big-endian length followed by its
UTF-8 bytes, so no choice of field values can make two different tuples encode alike
(a delimiter-joined string could).
"""

from __future__ import annotations

import struct
from dataclasses import astuple, dataclass

from relgate.errors import IntegrityError

FIELDS = ("sampleId", "sourceId", "sourceVersion", "logicalContentDigest", "split", "schemaDigest")
_LEN = struct.Struct(">I")


@dataclass(frozen=True, order=True)
class MemberTuple:
    sampleId: str
    sourceId: str
    sourceVersion: str
    logicalContentDigest: str
    split: str
    schemaDigest: str

    def encode(self) -> bytes:
        return encode_fields(astuple(self))


def encode_fields(fields: tuple[str, ...] | list[str]) -> bytes:
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
