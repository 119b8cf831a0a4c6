"""Migration 4 on a catalog written by the previous code (SQLite and PostgreSQL): runs
stored as ``CREATED`` become ADMITTED, and rows still written as CREATED keep working."""

import relgate.catalog.db as catalog_db
from relgate.catalog.db import Database, execute, one
from relgate.catalog.migrations import MIGRATIONS
from relgate.runs.run_end import cancel_run
from relgate.runs.store import get_run, run_state


def _insert_run(conn, run_id, state):
    execute(
        conn,
        "INSERT INTO runs (run_id, alias, root_digest, permit_id, purpose, world_size,"
        " assignment_epoch, barrier_epoch, state, created_at, updated_at)"
        " VALUES (:r, 'train', :d, :p, 'demo', 1, 0, -1, :s, 'then', 'then')",
        {"r": run_id, "d": "sha256:" + "a" * 64, "p": f"permit-{run_id}", "s": state},
    )


def test_migration_4_renames_created_runs(db_url, monkeypatch):
    db = Database(db_url)
    try:
        monkeypatch.setattr(catalog_db, "MIGRATIONS", tuple(m for m in MIGRATIONS if m.version < 4))
        assert db.migrate() == [1, 2, 3]
        with db.tx() as conn:
            _insert_run(conn, "run-old", "CREATED")
        monkeypatch.setattr(catalog_db, "MIGRATIONS", MIGRATIONS)
        assert 4 in db.migrate()
        with db.tx() as conn:
            row = one(conn, "SELECT state, ended_at, end_reason FROM runs WHERE run_id = 'run-old'")
        assert row == {"state": "ADMITTED", "ended_at": None, "end_reason": None}
    finally:
        db.dispose()


def test_a_run_still_stored_as_created_is_read_and_ended_as_admitted(g):
    with g.ws.db.tx() as conn:
        _insert_run(conn, "run-legacy", "CREATED")
    assert run_state(get_run(g.ws.db, "run-legacy")) == "ADMITTED"
    out = cancel_run(g.ws, "run-legacy", actor="ops")
    assert out["state"] == "CANCELLED"
