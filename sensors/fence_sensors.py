"""Fence sensors: when a fence advances, re-check every snapshot it hit.

The gate records hits inside the fence-advance transaction; the sensor only turns new
hits into a re-check run, keyed by the fence watermark so a run is requested once.
It never opens a catalog transaction itself: it asks :mod:`relgate.gate.recheck`.
"""

import json

import dagster as dg

from pipelines.jobs import recheck_job
from relgate.gate.recheck import current_watermark, hit_subjects
from resources.relgate import RelgateResource


def _fence_sensor(fence_kind: str) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"{fence_kind}_fence_sensor",
        job=recheck_job,
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Re-checks snapshots hit when the {fence_kind} fence advances.",
    )
    def watch(
        context: dg.SensorEvaluationContext, relgate: RelgateResource
    ) -> dg.SensorResult | dg.SkipReason:
        ws = relgate.workspace()
        current = current_watermark(ws, fence_kind)
        seen = int(json.loads(context.cursor)["seen"]) if context.cursor else 0
        if current <= seen:
            return dg.SkipReason(f"{fence_kind} fence still at {current}")
        subjects = hit_subjects(ws, fence_kind, seen)
        cursor = json.dumps({"seen": current})
        if not subjects:
            return dg.SensorResult(
                skip_reason=f"{fence_kind} fence {seen}->{current} hit no snapshot", cursor=cursor
            )
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=f"{fence_kind}-{current}",
                    run_config={
                        "ops": {
                            "recheck_snapshots": {
                                "config": {
                                    "subjects": [f"{k}:{d}" for k, d in subjects],
                                    "fence": fence_kind,
                                    "watermark": current,
                                }
                            }
                        }
                    },
                    tags={"relgate/fence": fence_kind, "relgate/watermark": str(current)},
                )
            ],
            cursor=cursor,
        )

    return watch


tombstone_fence_sensor = _fence_sensor("tombstone")
benchmark_fence_sensor = _fence_sensor("benchmark")

__all__ = ["benchmark_fence_sensor", "tombstone_fence_sensor"]
