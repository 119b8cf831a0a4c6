"""The relgate code location: every asset, check, job, schedule, sensor and resource."""

from __future__ import annotations

import dagster as dg

from assets.checkpoints import checkpoint_assets
from assets.fence_checks import fence_checks
from assets.lifecycle import gc_job, gc_schedule, lifecycle_assets
from assets.nightly import (
    nightly_assets,
    nightly_snapshot_job,
    nightly_snapshot_schedule,
)
from assets.releases import release_assets, release_checks
from assets.snapshots import replay_checks, snapshot_assets, snapshot_checks
from assets.source_specs import source_assets
from assets.versions import version_assets
from pipelines.jobs import (
    IN_PROCESS,
    distribution_job,
    recheck_job,
    release_job,
    release_job_celery,
    retention_plan_job,
    snapshot_build_job,
    snapshot_release_job,
)
from pipelines.run_jobs import run_jobs
from resources.fleet import FleetResource
from resources.io_managers import RelgateIOManager
from resources.relgate import RelgateResource
from sensors.fence_sensors import benchmark_fence_sensor, tombstone_fence_sensor
from sensors.gate_sensor import gate_state_sensor

defs = dg.Definitions(
    assets=[
        *source_assets,
        *snapshot_assets,
        *nightly_assets,
        *release_assets,
        *checkpoint_assets,
        *lifecycle_assets,
        *version_assets,
    ],
    asset_checks=[*snapshot_checks, *replay_checks, *release_checks, *fence_checks],
    jobs=[
        snapshot_build_job,
        nightly_snapshot_job,
        snapshot_release_job,
        release_job,
        release_job_celery,
        distribution_job,
        recheck_job,
        gc_job,
        retention_plan_job,
        *run_jobs,
    ],
    schedules=[nightly_snapshot_schedule, gc_schedule],
    # UI materializations too run their steps in the run's process (pipelines/jobs.py)
    executor=IN_PROCESS,
    sensors=[tombstone_fence_sensor, benchmark_fence_sensor, gate_state_sensor],
    resources={
        "relgate": RelgateResource(),
        "pipes_subprocess_client": dg.PipesSubprocessClient(),
        # the embedded local fleet unless coordinator addresses are set (docs/fleet-service.md)
        "fleet": FleetResource(),
        # local pickles unless configured with a bucket (release_job_celery: docs/deploy.md)
        "io_manager": RelgateIOManager(),
    },
)


def release_job_celery_def() -> dg.JobDefinition:
    """``release_job_celery`` resolved: wrap with ``dagster.reconstructable`` to execute it
    from Python (every celery worker re-imports it by this module and name)."""
    return defs.resolve_job_def("release_job_celery")
