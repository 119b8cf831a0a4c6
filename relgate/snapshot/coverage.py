"""What a validation report says about a snapshot's sources and lineage.

* **Watermark coverage**, per pinned source: the pinned watermark against the source's
  current one, events (CDC offsets, objects) after the pin, late events (at or below the
  watermark, arrived after pinning) and whether the pin covers its watermark.
* **Unversioned objects**, per object-prefix source: pinned objects whose version id is
  empty or ``null`` (an unversioned bucket), counted from the pinned object list.
* **Lineage**: a member is traced when its ``sourceId`` names a pinned entry and its
  ``sourceVersion`` one of that entry's pinned versions (the Iceberg snapshot id, a
  ``key@version`` of the pin list, a CDC ``offset:N`` at or below the high offset).
* **Build latency** from the manifest's provenance times.

Every figure is an integer (fractions as parts per million) so the signed JSON stays
canonical; the Dagster layer turns them into plottable floats.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Final

import polars as pl
from pydantic import Field, StrictBool, StrictInt, StrictStr

from relgate.documents import snapshot_manifest as mf
from relgate.documents.source_pins import CdcPin, IcebergPin, ObjectPrefixPin, SourceEntry
from relgate.errors import RejectedError, RelgateError
from relgate.integrity.contract import Contract
from relgate.objects.cas import ContentStore, digest_of_uri
from relgate.sources.source import Source

PPM: Final = 1_000_000
#: Version ids an unversioned store gives its objects.
UNVERSIONED_IDS: Final = frozenset({"", "null"})
_OFFSET = "offset:"


def _absent(value: object) -> bool:
    return value is None


class SourceCoverage(Contract):
    """One pinned source's watermark against the source now."""

    source: StrictStr
    kind: StrictStr
    pinned: StrictStr
    current: StrictStr | None = Field(default=None, exclude_if=_absent)
    events_after_pin: StrictInt | None = Field(default=None, exclude_if=_absent)
    late_events: StrictInt
    unversioned_objects: StrictInt | None = Field(default=None, exclude_if=_absent)
    covered: StrictBool


class Lineage(Contract):
    """Members traceable to a pinned source entry and version."""

    members: StrictInt
    traced: StrictInt
    untraced: StrictInt
    completeness_ppm: StrictInt


class BuildLatency(Contract):
    started_at: StrictStr
    ended_at: StrictStr
    seconds: StrictInt


def _pin_objects(cas: ContentStore, entry: ObjectPrefixPin) -> list[tuple[str, str]]:
    """(key, version) of every object the pin list names (hostile until parsed)."""
    ref = entry.objects
    where = f"{entry.id}: pin list"
    doc = json.loads(cas.get(digest_of_uri(ref.uri), ref.object_version))
    objects = doc.get("objects") if isinstance(doc, dict) else None
    if not isinstance(objects, list) or not all(
        isinstance(o, list) and len(o) >= 2 and all(isinstance(x, str) for x in o[:2])  # noqa: PLR2004 - key and version
        for o in objects
    ):
        raise RejectedError("pin list is malformed", object=where, check="pin-list")
    return [(str(o[0]), str(o[1])) for o in objects]


class LineageIndex:
    """The pinned versions of every source entry, to trace members against."""

    def __init__(self, cas: ContentStore, entries: Sequence[SourceEntry]) -> None:
        self.versions: dict[str, pl.Series] = {}
        self.cdc_high: dict[str, int] = {}
        self.unversioned: dict[str, int] = {}
        for entry in entries:
            if isinstance(entry, IcebergPin):
                self.versions[entry.id] = pl.Series([entry.table_snapshot], dtype=pl.String)
            elif isinstance(entry, ObjectPrefixPin):
                try:
                    objects = _pin_objects(cas, entry)
                except RelgateError:
                    objects = []  # unreadable pin: nothing traces to it (readability says why)
                self.versions[entry.id] = pl.Series(
                    [f"{k}@{v}" for k, v in objects], dtype=pl.String
                )
                self.unversioned[entry.id] = sum(1 for _k, v in objects if v in UNVERSIONED_IDS)
            elif isinstance(entry, CdcPin):
                self.cdc_high[entry.id] = entry.high_offset

    def traced(self, chunk: pl.DataFrame) -> pl.Series:
        """Per member row: does its (sourceId, sourceVersion) name a pinned version?"""
        source, version = pl.col("sourceId"), pl.col("sourceVersion")
        hit = pl.lit(value=False)
        for source_id, versions in self.versions.items():
            hit = hit | ((source == source_id) & version.is_in(versions.implode()))
        for source_id, high in self.cdc_high.items():
            offset = version.str.strip_prefix(_OFFSET).cast(pl.Int64, strict=False)
            cdc = version.str.starts_with(_OFFSET) & offset.is_between(0, high)
            hit = hit | ((source == source_id) & cdc.fill_null(value=False))
        return chunk.select(hit.alias("traced"))["traced"]


def lineage(members: int, traced: int) -> Lineage:
    ppm = PPM if members == 0 else traced * PPM // members
    return Lineage(members=members, traced=traced, untraced=members - traced, completeness_ppm=ppm)


def _current(
    source: Source, entry: SourceEntry, store_listing: int | None
) -> tuple[str | None, int | None]:
    """The source's current watermark label and the events after the pin."""
    if isinstance(entry, ObjectPrefixPin):
        if store_listing is None:
            return None, None
        return f"{store_listing} objects", max(store_listing - entry.objects.count, 0)
    try:
        now = source.pin().entry
    except RelgateError:
        return None, None
    if isinstance(entry, CdcPin) and isinstance(now, CdcPin):
        return now.label, max(now.high_offset - entry.high_offset, 0)
    if isinstance(entry, IcebergPin) and isinstance(now, IcebergPin):
        return now.label, int(now.table_snapshot != entry.table_snapshot)
    return now.label, None


def source_coverage(
    source: Source,
    entry: SourceEntry,
    *,
    late: int,
    readable: bool,
    listing: int | None,
    unversioned: Mapping[str, int],
) -> SourceCoverage:
    """One source's coverage row (``listing``: live objects under a prefix source now)."""
    current, after = _current(source, entry, listing)
    return SourceCoverage(
        source=entry.id,
        kind=entry.kind,
        pinned=entry.label,
        current=current,
        events_after_pin=after,
        late_events=late,
        unversioned_objects=unversioned.get(entry.id),
        covered=readable and late == 0,
    )


def _instant(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


def build_latency(manifest: mf.SnapshotManifest) -> BuildLatency | None:
    """Seconds from the build's start (fences read) to its end (manifest sealed)."""
    generated = manifest.provenance.was_generated_by
    try:
        span = _instant(generated.ended_at_time) - _instant(generated.started_at_time)
    except ValueError:
        return None
    seconds = int(span.total_seconds())
    return BuildLatency(
        started_at=generated.started_at_time, ended_at=generated.ended_at_time, seconds=seconds
    )
