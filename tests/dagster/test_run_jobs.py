"""Run lifecycle jobs on a temp Dagster instance (catalog on SQLite and PostgreSQL)."""

from support.instances import dagster_instance

from pipelines.definitions import defs
from pipelines.run_jobs import run_admit_job, run_cancel_job, run_finish_job
from relgate.catalog.permit_table import get_permit
from relgate.runs.store import get_run
from resources.relgate import RelgateResource
from tests.release.conftest import snapshot, ws  # noqa: F401 - fixtures
from tests.release.test_runs import PURPOSE, _published, _worker


def _config(op, **values):
    return {"ops": {op: {"config": values}}}


def test_admit_finish_and_cancel_jobs(ws, snapshot):  # noqa: F811
    old = _published(ws, snapshot)
    _published(ws, snapshot, records_per_shard=25)
    for job in ("run_admit_job", "run_finish_job", "run_cancel_job"):
        assert defs.resolve_job_def(job) is not None
    resources = {"relgate": RelgateResource(home=str(ws.home))}
    with dagster_instance() as instance:
        admitted = run_admit_job.execute_in_process(
            instance=instance,
            resources=resources,
            run_config=_config("admit_training_run", root=old.digest, purpose=PURPOSE),
        )
        assert admitted.success
        run = admitted.output_for_node("admit_training_run")
        assert run["rootDigest"] == old.digest and run["state"] == "ADMITTED"
        stale = run_admit_job.execute_in_process(
            instance=instance,
            resources=resources,
            run_config=_config(
                "admit_training_run", alias="train", expect_generation=1, purpose=PURPOSE
            ),
            raise_on_error=False,
        )
        assert not stale.success  # the alias is at generation 2
        failure = stale.failure_data_for_node("admit_training_run")
        assert "alias-generation" in failure.error.message

        proc = _worker(ws.home, run["runId"], 0)
        assert proc.wait(timeout=120) == 0, proc.communicate()
        finished = run_finish_job.execute_in_process(
            instance=instance,
            resources=resources,
            run_config=_config("finish_training_run", run_id=run["runId"], reason="converged"),
        )
        assert finished.success
        assert get_run(ws.db, run["runId"]).state == "FINISHED"
        assert get_permit(ws.db, run["permit"]).state == "CLOSED"

        other = run_admit_job.execute_in_process(
            instance=instance,
            resources=resources,
            run_config=_config("admit_training_run", alias="train", purpose=PURPOSE),
        ).output_for_node("admit_training_run")
        cancelled = run_cancel_job.execute_in_process(
            instance=instance,
            resources=resources,
            run_config=_config("cancel_training_run", run_id=other["runId"]),
        )
        assert cancelled.success
        assert get_run(ws.db, other["runId"]).state == "CANCELLED"
        again = run_finish_job.execute_in_process(
            instance=instance,
            resources=resources,
            run_config=_config("finish_training_run", run_id=other["runId"]),
            raise_on_error=False,
        )
        assert not again.success
        assert "run-state" in again.failure_data_for_node("finish_training_run").error.message
