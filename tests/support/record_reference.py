"""Row-at-a-time reference encodings the vectorised record paths must agree with.

Written independently of :mod:`relgate.records.values` and :mod:`relgate.documents.shard_format`
(struct and hashlib over Python values), from the rules in their module docstrings.
"""

import hashlib
import re
import struct

from relgate.records.record_schema import RecordSchema

_FIXED = {
    "bool": ">?",
    "int8": ">b",
    "int16": ">h",
    "int32": ">i",
    "int64": ">q",
    "uint8": ">B",
    "uint16": ">H",
    "uint32": ">I",
    "uint64": ">Q",
    "float32": ">f",
    "float64": ">d",
}
_LIST = re.compile(r"^(?:large_)?list<(\w+)>$")


def lp(fields: list[bytes]) -> bytes:
    """The 4-byte big-endian length-prefixed tuple encoding."""
    return b"".join(struct.pack(">I", len(f)) + f for f in fields)


def value_bytes(value, type_name: str, nullable: bool = False) -> bytes:
    if nullable:
        return b"\x00" if value is None else b"\x01" + value_bytes(value, type_name)
    if type_name in ("string", "large_string"):
        return value.encode("utf-8")
    if type_name in ("binary", "large_binary"):
        return bytes(value)
    if type_name in _FIXED:
        return struct.pack(_FIXED[type_name], value)
    item = _LIST.match(type_name).group(1)
    return b"".join(struct.pack(_FIXED[item], v) for v in value)


def content_digest(record: dict, schema: RecordSchema) -> str:
    fields = [schema.name.encode()]
    for name in schema.content:
        spec = schema.field(name)
        fields.append(value_bytes(record[name], spec.type, spec.nullable))
    return "sha256:" + hashlib.sha256(lp(fields)).hexdigest()


def stream_bytes(header: bytes, schema: RecordSchema, records: list[dict]) -> bytes:
    """The canonical record stream of shard records (dicts with every shard column)."""
    out = bytearray(header)
    for r in records:
        fields = [r["sampleId"], r["sourceId"], r["sourceVersion"], content_digest(r, schema)]
        fields.append(r["split"])
        encoded = [f.encode() for f in fields]
        for name in schema.attributes:
            spec = schema.field(name)
            encoded.append(value_bytes(r[name], spec.type, spec.nullable))
        encoded.append(str(r["tokens"]).encode())
        out += lp(encoded)
    return bytes(out)


__all__ = ["content_digest", "lp", "stream_bytes", "value_bytes"]
