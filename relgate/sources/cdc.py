"""A CDC change log read to a high watermark with contiguous offsets.

The log is a sequence of immutable JSON-lines segments ``<prefix><first offset>.jsonl``
(written by conditional create, like a Kafka Connect sink would).  Each event carries a
log ``offset`` (contiguous from 0), the source ``commit`` position, an ``op``
(``upsert``/``delete``) and the record.  Pinning reads every segment, proves the offsets
are contiguous (a gap is an error, never a warning), and records the high watermark
offset and the commit watermark.  An event that lands after pinning with a commit
position at or below the commit watermark is *late*: the snapshot built without it is
INCOMPLETE.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from relgate.documents.source_pins import CdcPin, PinList, SourceEntry, SourcePin, expect_pin
from relgate.errors import IntegrityError, RejectedError
from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.contract import JsonObject, JsonValue
from relgate.objects.cas import ContentStore, digest_of_uri
from relgate.objects.layout import cdc_segment_key
from relgate.objects.versioned import ObjectStore
from relgate.records.record_schema import TEXT_SCHEMA, RecordSchema
from relgate.records.rows import RowBuilder, row_error
from relgate.sources.source import Source, parse_row

PIN_KIND = "relgate.cdc-pin.v1"


#: Where a segment lives (the one spelling is in :mod:`relgate.objects.layout`).
segment_key = cdc_segment_key


def append_segment(
    store: ObjectStore, prefix: str, events: Sequence[Mapping[str, JsonValue]]
) -> str:
    """Write one segment (used by producers, the demo and tests)."""
    key = segment_key(prefix, int(str(events[0]["offset"])))
    store.create(key, b"".join(json.dumps(e, sort_keys=True).encode() + b"\n" for e in events))
    return key


@dataclass(frozen=True)
class _Event:
    """One change event with valid positions, op and id (``record``: the whole event;
    its record fields are checked against the schema when the event is applied)."""

    offset: int
    commit: int
    op: str
    id: str
    record: JsonObject
    at: str


def _position(event: JsonObject, name: str, at: str) -> int:
    value = event.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise row_error(at, f"field {name!r} is not a non-negative integer")
    return value


def _events(data: bytes, where: str, rows: RowBuilder) -> Iterable[_Event]:
    """Validated events of one segment (``where``: source and segment version)."""
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        at = f"{where} line {number}"
        event = parse_row(line, at)
        offset, commit = _position(event, "offset", at), _position(event, "commit", at)
        op = event.get("op")
        if op not in ("upsert", "delete"):
            raise row_error(at, "field 'op' is neither upsert nor delete")
        if op == "upsert":
            rows.check(event, at)  # every upsert is a valid record, superseded or not
        yield _Event(offset, commit, str(op), str(event["id"]), event, at)


class CdcSource(Source):
    kind = "cdc"

    def __init__(
        self, source_id: str, *, cas: ContentStore, prefix: str, schema: RecordSchema = TEXT_SCHEMA
    ) -> None:
        super().__init__(source_id, schema=schema)
        self.cas = cas
        self.store = cas.store
        self.prefix = prefix

    def pin(self) -> SourcePin:
        segments = []
        expected = 0
        commit_wm = -1
        for version in self.store.list(self.prefix):
            data = self.store.get(version.key, version.version_id)
            where = f"{self.id}:{version.key}@{version.version_id}"
            events = list(_events(data, where, RowBuilder(self.schema)))
            for event in events:
                offset = event.offset
                if offset != expected:
                    raise RejectedError(
                        f"CDC offsets are not contiguous: expected {expected}, found {offset}",
                        object=f"{self.id}:{version.key}",
                        check="cdc-contiguous",
                        details={"expected": expected, "found": offset},
                    )
                expected += 1
                commit_wm = max(commit_wm, event.commit)
            segments.append([version.key, version.version_id, len(events)])
        doc = {"kind": PIN_KIND, "prefix": self.prefix, "segments": segments}
        ref = self.cas.put(canonical_bytes(doc))
        entry = CdcPin(
            id=self.id,
            stream=self.prefix,
            cdc_high_watermark=f"offset:{expected - 1}",
            commit_watermark=commit_wm,
            segments=PinList(uri=ref.uri, object_version=ref.version_id, count=len(segments)),
        )
        return SourcePin(entry=entry, stats={"events": expected, "segments": len(segments)})

    def _segments(self, entry: SourceEntry) -> list[list[Any]]:
        ref = expect_pin(entry, CdcPin, self.id).segments
        doc = json.loads(self.cas.get(digest_of_uri(ref.uri), ref.object_version))
        if doc.get("kind") != PIN_KIND or len(doc["segments"]) != ref.count:
            raise IntegrityError(
                "CDC pin does not match the manifest",
                object=self.id,
                check="pin-list",
                digest=digest_of_uri(ref.uri),
            )
        return list(doc["segments"])

    def read(self, entry: SourceEntry) -> pa.Table:
        high = expect_pin(entry, CdcPin, self.id).high_offset
        state: dict[str, _Event] = {}
        expected = 0
        rows = RowBuilder(self.schema)
        for key, version_id, count in self._segments(entry):
            where = f"{self.id}:{key}@{version_id}"
            events = list(_events(self.store.get(key, version_id), where, rows))
            if len(events) != count:
                raise IntegrityError(
                    "CDC segment changed since pinning",
                    object=f"{self.id}:{key}@{version_id}",
                    check="cdc-segment",
                )
            for event in events:
                offset = event.offset
                if offset != expected:
                    raise IntegrityError(
                        "CDC offsets are not contiguous",
                        object=f"{self.id}:{key}",
                        check="cdc-contiguous",
                    )
                expected += 1
                if offset > high:
                    break
                sample = event.id
                if event.op == "delete":
                    state.pop(sample, None)
                else:
                    state[sample] = event
        if expected - 1 < high:
            raise IntegrityError(
                "CDC log ends before the pinned high watermark",
                object=self.id,
                check="cdc-contiguous",
            )
        for sample in sorted(state):
            event = state[sample]
            rows.add(sample, event.record, f"offset:{event.offset}", event.at)
        return rows.table()

    def check_readable(self, entry: SourceEntry) -> list[str]:
        problems = []
        for key, version_id, _count in self._segments(entry):
            try:
                self.store.head(key, version_id)
            except RejectedError:
                raise  # the store refused what it holds: a refusal, not an unreadable segment
            except Exception as exc:  # unreadable: missing, permissions, network, throttling
                problems.append(
                    f"{self.id}: segment {key}@{version_id} unreadable"
                    f" ({type(exc).__name__}): {exc}"
                )
        return problems

    def late_events(self, entry: SourceEntry) -> int:
        """Events past the pinned offset whose commit position is at or below the watermark."""
        pin = expect_pin(entry, CdcPin, self.id)
        high, commit_wm = pin.high_offset, pin.commit_watermark
        pinned = {key for key, _v, _c in self._segments(entry)}
        late = 0
        for version in self.store.list(self.prefix):
            if version.key in pinned:
                continue
            where = f"{self.id}:{version.key}@{version.version_id}"
            data = self.store.get(version.key, version.version_id)
            for event in _events(data, where, RowBuilder(self.schema)):
                if event.offset > high and event.commit <= commit_wm:
                    late += 1
        return late
