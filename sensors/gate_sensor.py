"""The gate observed: what is live now, on the alias and permit assets.

Every ``minimum_interval_seconds`` the sensor reads the gate's live state
(:func:`relgate.lifecycle.live_state.live_state`: each alias's generation and digest, the
open permits, the runs not yet ended) and, when it changed since the last tick (its
cursor is the state's fingerprint), records it as asset observations: on
``snapshot_alias`` and ``release_alias`` every alias of that kind with its generation and
active digest, on ``gate_permit`` the open permits and live runs.  So a change made
outside Dagster (``relgate release rollback``, ``relgate snapshot activate``, a run
finished from the command line) shows on those pages within one interval, beside the last
materialization, which only says what the last Dagster run did.
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from assets.table_metadata import typed_table
from assets.versions import live_partition
from relgate.lifecycle.live_state import LiveAlias, LiveState, live_state
from resources.relgate import RelgateResource

#: The asset each alias kind is observed on.
ALIAS_ASSETS = {"snapshot": "snapshot_alias", "release": "release_alias"}
PERMIT_ASSET = "gate_permit"
#: Seconds between ticks (the UI shows a gate change within this).
INTERVAL_S = 30


def _alias_metadata(aliases: tuple[LiveAlias, ...]) -> dict[str, Any]:
    rows = [
        {"alias": a.alias, "generation": a.generation, "activeDigest": a.active_digest or ""}
        for a in aliases
    ]
    flat: dict[str, Any] = {}
    for a in aliases:
        flat[f"generation.{a.alias}"] = a.generation
        flat[f"activeDigest.{a.alias}"] = a.active_digest or ""
        flat[f"livePartition.{a.alias}"] = live_partition(a.kind, a.active_digest)
    return {"source": "gate", "aliases": typed_table(rows), **flat}


def gate_observations(state: LiveState) -> list[dg.AssetObservation]:
    """The observations one tick records for ``state``."""
    events = [
        dg.AssetObservation(asset_key=key, metadata=_alias_metadata(state.of_kind(kind)))
        for kind, key in ALIAS_ASSETS.items()
    ]
    permits = [
        {
            "permitId": p.permit_id,
            "root": p.root_digest,
            "alias": p.alias,
            "generation": p.generation,
            "purpose": p.purpose,
            "createdAt": p.created_at,
        }
        for p in state.open_permits
    ]
    runs = [r.to_json() for r in state.live_runs]
    events.append(
        dg.AssetObservation(
            asset_key=PERMIT_ASSET,
            metadata={
                "source": "gate",
                "openPermits": len(permits),
                "liveRuns": len(runs),
                "permits": typed_table(permits),
                "runs": typed_table(runs),
            },
        )
    )
    return events


@dg.sensor(
    name="gate_state_sensor",
    minimum_interval_seconds=INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Observes the gate: every alias's generation and digest, open permits and"
    " live runs, recorded on the alias and permit assets whenever they change.",
)
def gate_state_sensor(
    context: dg.SensorEvaluationContext, relgate: RelgateResource
) -> dg.SensorResult | dg.SkipReason:
    state = live_state(relgate.workspace().db)
    mark = state.fingerprint()
    if context.cursor == mark:
        return dg.SkipReason("the gate is as it was at the last tick")
    return dg.SensorResult(asset_events=gate_observations(state), cursor=mark)


__all__ = ["gate_observations", "gate_state_sensor"]
