"""Lifecycle assets: the retention plan (a dry run) and the GC job that can sweep.

The plan is an asset so the UI shows, per materialization, what is retained and by whom,
what names keep (registered transforms and tokenizers, tags, the workspace config), what
is kept as collected versions' audit trail, which tombstoned versions are still held
(their erased bytes wait for those holders), what a sweep would delete and why, and fails (closed) when a retained version is
incomplete.  Deleting is a separate job whose run config must say ``sweep: true``; the
schedule launches it as a dry run unless an operator changes that.
"""

from typing import Any

import dagster as dg

from assets.failures import refusals_fail
from assets.ownership import OWNERS, tags_for
from assets.table_metadata import typed_table
from relgate.lifecycle.collector import parse_duration, plan_gc, sweep
from resources.relgate import RelgateResource

GROUP = "lifecycle"


class RetentionPlanConfig(dg.Config):
    grace: str = "6h"


@dg.asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    description="GC dry run: retained versions and holders, deletion candidates and reasons.",
)
@refusals_fail
def retention_plan(
    context: dg.AssetExecutionContext, config: RetentionPlanConfig, relgate: RelgateResource
) -> dg.Output[dict[str, Any]]:
    ws = relgate.workspace()
    plan = plan_gc(ws, grace_seconds=parse_duration(config.grace)).report(limit=50)
    return dg.Output(
        plan.to_json(),
        metadata={
            "retained": len(plan.retained),
            "requiredObjects": plan.required_objects,
            "candidates": plan.candidate_count,
            "candidateBytes": plan.candidate_bytes,
            "excluded": typed_table(
                [{"reason": k, "objects": v} for k, v in plan.excluded.items()],
                [("reason", "string"), ("objects", "int")],
            ),
            "excludedObjects": sum(plan.excluded.values()),
            "named": typed_table(
                [{"key": n.key, "heldBy": ", ".join(n.held_by)} for n in plan.named],
                [("key", "string"), ("heldBy", "string")],
            ),
            "auditPolicyDays": plan.audit_policy.keep_days
            if plan.audit_policy.keep_days is not None
            else "forever",
            "auditObjects": plan.audit_objects,
            "auditKept": typed_table(
                [
                    {
                        "kind": a.kind,
                        "digest": a.subject,
                        "state": a.state,
                        "objects": len(a.objects),
                    }
                    for a in plan.audit_kept
                ],
                [("kind", "string"), ("digest", "string"), ("state", "string"), ("objects", "int")],
            ),
            "erasureHeld": typed_table(
                [
                    {"kind": v.kind, "digest": v.subject, "heldBy": ", ".join(v.held_by)}
                    for v in plan.erasure_held
                ],
                [("kind", "string"), ("digest", "string"), ("heldBy", "string")],
            ),
            "unknownOutcome": len(plan.unknown_outcome),
            "unknownOutcomeKeys": typed_table(
                [{"key": k} for k in plan.unknown_outcome], [("key", "string")]
            ),
        },
    )


class GcConfig(dg.Config):
    grace: str = "6h"
    sweep: bool = False  # dry run unless explicitly set


@dg.op(description="Plan, and sweep only when the run config says sweep: true.")
@refusals_fail
def garbage_collect(
    context: dg.OpExecutionContext, config: GcConfig, relgate: RelgateResource
) -> dict[str, Any]:
    ws = relgate.workspace()
    grace = parse_duration(config.grace)
    if not config.sweep:
        plan = plan_gc(ws, grace_seconds=grace).report(limit=0)
        context.log.info(f"dry run: {plan.candidate_count} candidates, nothing deleted")
        return {"mode": "plan", "candidates": plan.candidate_count}
    result = sweep(ws, actor=relgate.run_actor(), grace_seconds=grace)
    context.log.info(f"swept {result.deleted_count} objects ({result.deleted_bytes} bytes)")
    return {k: v for k, v in result.to_json().items() if k != "deleted"}


@dg.job(
    executor_def=dg.in_process_executor,
    description="Garbage collection: a dry run unless run config sets sweep: true.",
)
def gc_job() -> None:
    garbage_collect()


gc_schedule = dg.ScheduleDefinition(
    name="weekly_gc_plan",
    job=gc_job,
    cron_schedule="0 4 * * 0",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Weekly GC at 04:00 UTC Sunday; a dry run (sweep: false) by default.",
)

lifecycle_assets = [retention_plan]
