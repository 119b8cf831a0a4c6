"""The raw sources as external assets, so lineage starts at them (not at ``frozen_sources``).

One ``AssetSpec`` per source the workspace config declares (an Iceberg table, an object
prefix, a CDC change log), read when the code location loads; a workspace without sources
(a fresh checkout, before ``make demo`` seeds one) gets the demo's declared three.  Dagster
never materializes them: ``frozen_sources`` pins each to an exact version and records the
pin as an observation of that source.
"""

from collections.abc import Mapping, Sequence

import dagster as dg

from assets.ownership import OWNERS, tags_for
from relgate.demo.corpus import DEMO_SOURCES
from relgate.errors import RelgateError
from relgate.workspace import Workspace

GROUP = "sources"
KEY_PREFIX = "sources"
#: Dagster's kind tags (icons in the UI) per relgate source kind.
KINDS: Mapping[str, frozenset[str]] = {
    "iceberg": frozenset({"iceberg"}),
    "object-prefix": frozenset({"s3"}),
    "cdc": frozenset({"s3", "cdc"}),
}
#: The config field that locates each kind (the table, or the object prefix).
LOCATORS: Mapping[str, str] = {"iceberg": "table", "object-prefix": "prefix", "cdc": "prefix"}


def source_key(source_id: str) -> dg.AssetKey:
    return dg.AssetKey([KEY_PREFIX, source_id])


def source_spec(entry: Mapping[str, object]) -> dg.AssetSpec:
    """The external asset for one ``sources:`` entry of the workspace config."""
    kind = str(entry.get("kind"))
    locator = LOCATORS.get(kind, "")
    where = str(entry.get(locator, ""))
    return dg.AssetSpec(
        key=source_key(str(entry["id"])),
        group_name=GROUP,
        owners=OWNERS,
        tags=tags_for(GROUP),
        kinds=set(KINDS.get(kind, frozenset())),
        description=f"External {kind} source {where}: pinned by frozen_sources, never written.",
        metadata={"relgate/source_kind": kind, f"relgate/{locator or 'locator'}": where},
    )


def configured_sources(home: str | None = None) -> Sequence[Mapping[str, object]]:
    """The ``sources:`` entries of the workspace at ``home`` (default ``$RELGATE_HOME``),
    or the demo's declaration when there is no workspace or it declares none."""
    try:
        ws = Workspace.open(home)
    except (RelgateError, OSError, ValueError):
        return DEMO_SOURCES
    try:
        entries = ws.config.get("sources")
    finally:
        ws.close()
    if not isinstance(entries, list) or not entries:
        return DEMO_SOURCES
    return [e for e in entries if isinstance(e, Mapping) and "id" in e]


source_assets = [source_spec(entry) for entry in configured_sources()]
