"""Run lifecycle from Dagster: admit a run on an exact root, finish it, cancel it.

The same core calls as ``relgate run create --root``, ``run finish`` and ``run cancel``:
admission goes through the gate (purpose, zero fence hits against the current fences,
the alias generation when an alias is named, the stored envelope re-verified); ending a
run closes its permit and releases its hold so garbage collection may reclaim the root.
A refusal fails the op with the check name and digest in its metadata.
"""

from collections.abc import Callable
from typing import Any

import dagster as dg

from assets.failures import failure_of
from relgate.errors import RelgateError
from relgate.runs.admission import admit_run
from relgate.runs.run_end import cancel_run, finish_run
from resources.relgate import RelgateResource


class RunAdmitConfig(dg.Config):
    root: str = ""  # exact root digest; or
    alias: str = ""  # a release alias, resolved once
    #: with alias: refuse unless the alias is at this generation (None: any)
    expect_generation: int | None = None
    purpose: str = "demo-model-training"
    world_size: int = 1


class RunEndConfig(dg.Config):
    run_id: str
    reason: str = ""


def _gate_call(call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return call()
    except RelgateError as exc:
        raise failure_of(exc) from exc


def _observe(context: dg.OpExecutionContext, out: dict[str, Any]) -> None:
    context.log_event(
        dg.AssetObservation(
            asset_key="pinned_run",
            metadata={k: str(v) for k, v in out.items() if v is not None},
        )
    )


@dg.op(description="Admit a run on an exact root (or an alias read once) and issue its permit.")
def admit_training_run(
    context: dg.OpExecutionContext, config: RunAdmitConfig, relgate: RelgateResource
) -> dict[str, Any]:
    ws = relgate.workspace()
    out = _gate_call(
        lambda: admit_run(
            ws,
            root=config.root or None,
            alias=config.alias or None,
            expected_generation=config.expect_generation,
            purpose=config.purpose,
            world_size=config.world_size,
            actor=relgate.run_actor(),
        ).to_json()
    )
    _observe(context, out)
    return out


@dg.op(description="RUNNING -> FINISHED: close the run's permit and release its hold.")
def finish_training_run(
    context: dg.OpExecutionContext, config: RunEndConfig, relgate: RelgateResource
) -> dict[str, Any]:
    ws = relgate.workspace()
    reason = config.reason or "finished"
    out = _gate_call(
        lambda: finish_run(ws, config.run_id, actor=relgate.run_actor(), reason=reason).to_json()
    )
    _observe(context, out)
    return out


@dg.op(description="ADMITTED or RUNNING -> CANCELLED: close the run's permit and release its hold.")
def cancel_training_run(
    context: dg.OpExecutionContext, config: RunEndConfig, relgate: RelgateResource
) -> dict[str, Any]:
    ws = relgate.workspace()
    reason = config.reason or "cancelled"
    out = _gate_call(
        lambda: cancel_run(ws, config.run_id, actor=relgate.run_actor(), reason=reason).to_json()
    )
    _observe(context, out)
    return out


@dg.job(
    executor_def=dg.in_process_executor,
    description="Admit a training run on an exact root digest (or an alias, read once).",
)
def run_admit_job() -> None:
    admit_training_run()


@dg.job(
    executor_def=dg.in_process_executor,
    description="Finish a training run: its permit closes and its root is no longer held.",
)
def run_finish_job() -> None:
    finish_training_run()


@dg.job(
    executor_def=dg.in_process_executor,
    description="Cancel a training run: its permit closes and its root is no longer held.",
)
def run_cancel_job() -> None:
    cancel_training_run()


run_jobs = [run_admit_job, run_finish_job, run_cancel_job]
