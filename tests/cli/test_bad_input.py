"""Bad input at the command line is a usage error or a refusal (exit 2 or 3) that names the
argument, file or object and the check, never an internal error (exit 1).  Run in-process
through click's CliRunner on a real seeded workspace (cheap: no subprocess per command)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from support.workspaces import make_workspace

from relgate.catalog import schema
from relgate.catalog.db import Database
from relgate.catalog.migrations import MIGRATIONS
from relgate.cli.main import main
from relgate.errors import UsageError
from relgate.snapshot.build import EMPTY_SELECTION, SOURCE_UNKNOWN
from relgate.workspace import Workspace


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    ws = make_workspace(tmp_path_factory.mktemp("bad-input") / "home")
    ws.config["sources"].append({"id": "nothing", "kind": "object-prefix", "prefix": "raw/none/"})
    ws.save()
    return ws


def cli(home: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["--home", str(home), *args, "--json"], env=env)


def refused(result: Result, code: int = 3) -> dict[str, object]:
    """The one JSON object a refusal printed (asserting its exit code)."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, result.stdout
    body: dict[str, object] = json.loads(lines[0])
    return body


# -- item 7: refuse what cannot be meant ------------------------------------------------------


def test_an_unknown_source_is_refused_before_anything_is_pinned(ws: Workspace) -> None:
    body = refused(cli(ws.home, "snapshot", "build", "--source", "forum", "--source", "nope"))
    assert body["check"] == SOURCE_UNKNOWN
    assert body["object"] == "source 'nope'"
    assert "configured: ['chat-cdc', 'forum', 'nothing', 'tickets-eu']" in str(body["message"])
    # even with --allow-empty: a typo is not an empty selection
    body = refused(cli(ws.home, "snapshot", "build", "--source", "nope", "--allow-empty"))
    assert body["check"] == SOURCE_UNKNOWN


def test_an_empty_selection_is_refused_unless_allowed(ws: Workspace) -> None:
    before = cli(ws.home, "snapshot", "list").stdout
    body = refused(cli(ws.home, "snapshot", "build", "--source", "nothing"))
    assert (body["check"], body["object"]) == (EMPTY_SELECTION, "selection")
    assert cli(ws.home, "snapshot", "list").stdout == before  # no snapshot was recorded
    built = cli(ws.home, "snapshot", "build", "--source", "nothing", "--allow-empty")
    assert built.exit_code == 0, built.output
    assert json.loads(built.stdout)["members"] == 0
    some = cli(ws.home, "snapshot", "build", "--source", "nothing", "--source", "forum")
    assert some.exit_code == 0 and json.loads(some.stdout)["members"] > 0, some.output


def test_a_workspace_without_sources_builds_nothing(tmp_path: Path) -> None:
    bare = make_workspace(tmp_path / "bare", seed=False)
    body = refused(cli(bare.home, "snapshot", "build"))
    assert (body["check"], body["object"]) == (EMPTY_SELECTION, "sources")


# -- item 10: no internal error on bad input -------------------------------------------------


def test_a_database_error_outside_a_transaction_is_typed() -> None:
    """The CLI's last resort: a driver error that escaped the catalog's transactions."""
    from sqlalchemy.exc import OperationalError

    from relgate.catalog.db import CATALOG_UNAVAILABLE
    from relgate.cli.common import _typed

    lost = OperationalError("SELECT 1", {}, Exception("server closed the connection"))
    typed = _typed(lost)
    assert typed is not None and (typed.check, typed.exit_code) == (CATALOG_UNAVAILABLE, 4)
    assert _typed(ValueError("not a database error")) is None


def test_catalog_errors_are_typed_by_what_the_database_said() -> None:
    import sqlite3

    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    from relgate.catalog.db import CATALOG_SCHEMA, CATALOG_UNAVAILABLE, catalog_error
    from relgate.errors import UsageError

    locked = catalog_error(
        OperationalError("BEGIN", {}, sqlite3.OperationalError("database is locked\nmore"))
    )
    assert locked is not None and (locked.check, locked.exit_code) == (CATALOG_UNAVAILABLE, 4)
    assert locked.details == {"database": "database is locked"}
    silent = catalog_error(OperationalError("BEGIN", {}, sqlite3.OperationalError("")))
    assert silent is not None and silent.details == {"database": "OperationalError"}
    missing = catalog_error(
        ProgrammingError("SELECT", {}, Exception('relation "runs" does not exist\nLINE 1'))
    )
    assert isinstance(missing, UsageError) and missing.check == CATALOG_SCHEMA
    assert missing.details == {"database": 'relation "runs" does not exist'}
    assert catalog_error(IntegrityError("INSERT", {}, Exception("duplicate key"))) is None
    assert catalog_error(ProgrammingError("SELECT", {}, Exception("syntax error"))) is None
    assert catalog_error(ValueError("not a database error")) is None


def _snapshot(ws: Workspace) -> str:
    built = cli(ws.home, "snapshot", "build", "--alias", "bad-input")
    assert built.exit_code == 0, built.output
    digest: str = json.loads(built.stdout)["snapshot"]
    return digest


def test_pin_expiry_takes_the_documented_duration_and_refuses_a_bad_date(ws: Workspace) -> None:
    digest = _snapshot(ws)
    pin = cli(ws.home, "pin", "add", digest, "--owner", "o", "--reason", "r", "--expires", "30d")
    assert pin.exit_code == 0, pin.output
    assert json.loads(pin.stdout)["expiresAt"] > "2026"
    for bad in ("2027-13-45", "tomorrow", "30x", "0d", "9999999d", "\x1b[31m"):
        result = cli(
            ws.home, "pin", "add", digest, "--owner", "o", "--reason", "r", "--expires", bad
        )
        assert result.exit_code == 2, (bad, result.output)
        assert "--expires" in result.output


def test_a_checkpoint_position_that_is_not_json_names_the_file(
    ws: Workspace, tmp_path: Path
) -> None:
    digest = _snapshot(ws)
    text = tmp_path / "position.txt"
    text.write_text("not json {")
    result = cli(ws.home, "pin", "add", digest, "--owner", "o", "--reason", "r",
                 "--checkpoint-position", str(text))  # fmt: skip
    assert result.exit_code == 2 and str(text) in result.output and "not a JSON" in result.output
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    result = cli(ws.home, "pin", "add", digest, "--owner", "o", "--reason", "r",
                 "--checkpoint-position", str(listed))  # fmt: skip
    assert refused(result, 2)["check"] == "checkpoint-position"
    half = tmp_path / "half.json"  # the root is right, the cursors are not there
    half.write_text(json.dumps({"root": digest, "seed": 1, "shards": []}))
    result = cli(ws.home, "pin", "add", digest, "--owner", "o", "--reason", "r",
                 "--checkpoint-position", str(half))  # fmt: skip
    assert refused(result, 3)["check"] == "schema"
    assert "input-position" in result.output


def test_a_corrupt_workspace_config_is_refused_naming_the_file(tmp_path: Path) -> None:
    home = tmp_path / "corrupt"
    assert cli(home, "init").exit_code == 0
    config = home / "relgate.json"
    for damage in (config.read_bytes()[:40], b"[]", b"\xff\xfe"):
        config.write_bytes(damage)
        body = refused(cli(home, "snapshot", "list"))
        assert (body["check"], body["object"]) == ("workspace-config", str(config))


def test_a_workspace_made_for_another_catalog_url_names_the_url(tmp_path: Path) -> None:
    home = tmp_path / "elsewhere"
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert cli(home, "init", env={"RELGATE_CATALOG_URL": other}).exit_code == 0
    assert cli(home, "snapshot", "list", env={"RELGATE_CATALOG_URL": other}).exit_code == 0
    body = refused(cli(home, "snapshot", "list"), 2)  # the config's own catalog.db: absent
    assert (body["check"], body["object"]) == ("catalog-schema", f"sqlite:///{home / 'catalog.db'}")
    assert not (home / "catalog.db").exists()  # refusing it did not create it
    (home / "catalog.db").write_bytes(b"")  # present but empty: no relgate schema
    empty = refused(cli(home, "snapshot", "list"), 2)
    assert empty["check"] == "catalog-schema"
    assert empty["details"] == {"schemaVersion": 0, "pending": [m.version for m in MIGRATIONS]}
    # `relgate migrate` makes that empty catalog a relgate catalog; opening never does
    migrated = cli(home, "migrate")
    assert migrated.exit_code == 0, migrated.output
    assert json.loads(migrated.stdout)["applied"] == [m.version for m in MIGRATIONS]
    assert cli(home, "snapshot", "list").exit_code == 0
    assert json.loads(cli(home, "migrate").stdout)["applied"] == []


def test_a_catalog_behind_this_relgate_is_refused_until_migrated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relgate with a migration the catalog lacks (a copy of the Alembic scripts with one
    more revision) refuses every command (exit 2, ``catalog-schema``, naming the pending
    version) instead of migrating on open, and ``relgate migrate`` applies exactly that
    revision."""
    home = tmp_path / "behind"
    assert cli(home, "init").exit_code == 0
    scripts = tmp_path / "scripts"
    shutil.copytree(schema.SCRIPT_LOCATION, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    newer = len(MIGRATIONS) + 1
    (scripts / "versions" / f"r{newer:04d}_probe.py").write_text(
        "from alembic import op\n"
        f"revision = {schema.revision_id(newer)!r}\n"
        f"down_revision = {schema.revision_id(newer - 1)!r}\n"
        "def upgrade():\n"
        "    op.execute('CREATE TABLE probe_newer (id INTEGER)')\n"
    )
    monkeypatch.setattr(schema, "SCRIPT_LOCATION", scripts)
    body = refused(cli(home, "snapshot", "list"), 2)
    assert body["check"] == "catalog-schema"
    assert body["details"] == {"schemaVersion": len(MIGRATIONS), "pending": [newer]}
    assert json.loads(cli(home, "migrate").stdout)["applied"] == [newer]
    assert cli(home, "snapshot", "list").exit_code == 0
    assert json.loads(cli(home, "migrate").stdout)["applied"] == []


def test_a_catalog_migrated_by_a_newer_relgate_is_refused(tmp_path: Path) -> None:
    """A catalog at a revision this relgate does not have (a newer relgate migrated it) is
    refused by every command and by ``relgate migrate`` (exit 2, ``catalog-schema``, naming
    the revision), never treated as empty."""
    home = tmp_path / "newer"
    assert cli(home, "init").exit_code == 0
    engine = sa.create_engine(f"sqlite:///{home / 'catalog.db'}")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    for args in (("snapshot", "list"), ("migrate",)):
        body = refused(cli(home, *args), 2)
        assert (body["check"], body["details"]["revision"]) == ("catalog-schema", "9999"), args


def test_a_catalog_from_before_alembic_is_stamped_then_current(tmp_path: Path) -> None:
    """A catalog whose applied versions are in the old ``schema_migrations`` table (no
    ``alembic_version``) is taken as at that version: nothing is re-applied (the catalog
    ``init`` made holds every migration, so the legacy table names the newest)."""
    newest = MIGRATIONS[-1].version
    home = tmp_path / "legacy"
    assert cli(home, "init").exit_code == 0
    engine = sa.create_engine(f"sqlite:///{home / 'catalog.db'}")
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE alembic_version"))
        conn.execute(
            sa.text(
                "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY,"
                " name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
        )
        conn.execute(
            sa.text("INSERT INTO schema_migrations VALUES (:v, 'newest', 'then')"), {"v": newest}
        )
    engine.dispose()
    legacy = Database(f"sqlite:///{home / 'catalog.db'}")
    assert (legacy.schema_version(), legacy.pending()) == (newest, [])
    legacy.dispose()
    assert cli(home, "snapshot", "list").exit_code == 0  # the newest version: current
    assert json.loads(cli(home, "migrate").stdout) == {"applied": [], "schemaVersion": newest}
    engine = sa.create_engine(f"sqlite:///{home / 'catalog.db'}")
    with engine.begin() as conn:
        assert conn.execute(
            sa.text("SELECT version_num FROM alembic_version")
        ).scalar() == schema.revision_id(newest)
    engine.dispose()


@pytest.mark.postgres
def test_postgres_killed_mid_gate_command_is_retriable(pg_dsn: str, tmp_path: Path) -> None:
    """The backend serving the gate transaction is terminated (pg_terminate_backend from
    another session) right after it took the gate lock: exit 4, catalog-unavailable, the
    alias did not move, and the same command then succeeds."""
    from sqlalchemy import create_engine, event, text
    from sqlalchemy.engine import Engine
    from support.postgres import fresh_database

    with fresh_database(pg_dsn) as url:
        ws = make_workspace(tmp_path / "pg", url)
        digest = _snapshot(ws)
        approved = cli(ws.home, "snapshot", "approve", digest, "--approver", "carol")
        assert approved.exit_code == 0, approved.output
        killer = create_engine(url)
        killed: list[int] = []

        def kill_own_backend(conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
            if killed or "FROM fences WHERE id = 1 FOR UPDATE" not in statement:
                return
            pid = conn.connection.dbapi_connection.info.backend_pid
            with killer.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:p, 10000)"), {"p": pid})
            killed.append(pid)

        event.listen(Engine, "before_cursor_execute", kill_own_backend)
        try:
            result = cli(ws.home, "snapshot", "activate", digest, "--alias", "pg-kill")
        finally:
            event.remove(Engine, "before_cursor_execute", kill_own_backend)
            killer.dispose()
        assert killed, "the gate transaction never ran"
        body = refused(result, 4)
        assert (body["check"], body["error"]) == ("catalog-unavailable", "catalog_unavailable")
        shown = cli(ws.home, "alias", "show", "pg-kill")
        assert shown.exit_code == 0 and json.loads(shown.stdout)["generation"] == 0
        again = cli(ws.home, "snapshot", "activate", digest, "--alias", "pg-kill")
        assert again.exit_code == 0, again.output
        ws.close()


def test_names_with_terminal_escapes_are_refused_before_they_are_stored(ws: Workspace) -> None:
    digest = _snapshot(ws)
    approvals = cli(ws.home, "snapshot", "show", digest).stdout
    body = refused(cli(ws.home, "snapshot", "approve", digest, "--approver", "\x1b[2Jmallory"))
    assert (body["check"], body["object"]) == ("identifier", "--approver")
    assert body["details"]["value"] == "'\\x1b[2Jmallory'"  # type: ignore[index]
    assert cli(ws.home, "snapshot", "show", digest).stdout == approvals  # nothing stored
    for args in (
        ("snapshot", "build", "--alias", "ok\u202egnp.exe"),
        ("fence", "tombstone", "add", "forum/0000001", "--reason", "gdpr\r\nforged: line"),
        ("pin", "add", digest, "--owner", "o\x07", "--reason", "r"),
        ("alias", "show", "\x9bcolour"),
        ("lineage", "\udcff"),  # argv bytes that are not UTF-8
    ):
        assert refused(cli(ws.home, *args))["check"] == "identifier", args
    assert refused(cli(ws.home, "lineage", "\x1b]8;;x"))["object"] == "SAMPLE_ID"  # an argument


def test_integers_beyond_the_catalog_range_are_usage_errors(ws: Workspace) -> None:
    body = refused(cli(ws.home, "retention", "set", "a", "--keep-last", str(2**63)), 2)
    assert (body["check"], body["object"]) == ("integer-range", "--keep-last")
    assert refused(cli(ws.home, "retention", "set", "a", "--keep-days", str(-(2**53))), 2)
    for fits in (str(2**53 - 1), "3"):  # the largest magnitude, and defaults for the rest
        result = cli(ws.home, "retention", "set", "a", "--keep-last", fits)
        assert result.exit_code == 0, result.output
    huge = cli(
        ws.home, "run", "create", "--alias", "x", "--purpose", "p", "--world-size", str(10**8)
    )
    assert huge.exit_code == 2 and "--world-size" in huge.output
    huge = cli(ws.home, "run", "create", "--alias", "x", "--purpose", "p", "--world-size", "200000")
    assert huge.exit_code == 2 and "--world-size" in huge.output


def test_expiry_and_json_file_values() -> None:
    """The option types themselves (no workspace): durations count from now, an offset is
    converted to UTC, out-of-range instants and unreadable files are usage errors."""
    import datetime as dt

    import click

    from relgate.cli.params import EXPIRY, JSON_FILE

    def instant(text: str) -> dt.datetime:
        return dt.datetime.strptime(EXPIRY.convert(text, None, None), "%Y-%m-%dT%H:%M:%S.%fZ")

    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    for text, delta in (("30d", dt.timedelta(days=30)), ("1s", dt.timedelta(seconds=1))):
        assert (
            now + delta - dt.timedelta(minutes=5)
            < instant(text)
            < now + delta + dt.timedelta(minutes=5)
        )
    assert instant("2027-01-31T02:00:00+02:00") == dt.datetime(2027, 1, 31)
    assert instant("2027-01-31") == dt.datetime(2027, 1, 31)
    for bad in ("999999d", "0s", "0001-01-01T00:00:00+01:00", "next week"):
        with pytest.raises(click.BadParameter):
            EXPIRY.convert(bad, None, None)
    for unreadable in ("/", "a\x00b", "/nonexistent/position.json"):
        with pytest.raises(click.BadParameter):
            JSON_FILE.convert(unreadable, None, None)


def test_the_revisions_read_without_alembic_are_alembics_own_chain() -> None:
    """Opening a workspace reads the revision chain from the script file names; Alembic's
    own walk of the same scripts, and the migrations list, give the same chain."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(schema.SCRIPT_LOCATION))
    walked = ScriptDirectory.from_config(config).walk_revisions()
    assert schema.chain() == [r.revision for r in reversed(list(walked))]
    assert schema.chain() == [schema.revision_id(m.version) for m in MIGRATIONS]


def test_a_command_that_opens_a_workspace_loads_neither_alembic_nor_polars(tmp_path: Path) -> None:
    """CLI start-up is most of a small command's cost: ``permit list`` on a workspace runs
    without importing Alembic (only migrations need it) or polars (only scans do)."""
    import subprocess
    import sys

    home = tmp_path / "home"
    assert cli(home, "init").exit_code == 0
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted({'alembic', 'polars'} & set(sys.modules))))\n"
        "from relgate.cli.main import main\n"
        f"main(['--home', {str(home)!r}, 'permit', 'list', '--json'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.splitlines()[-1] == "[]", done.stdout


@pytest.mark.parametrize("stray", ["r0009_gap.py", "newer-rev.py", "r12_short.py"])
def test_a_script_directory_the_chain_cannot_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stray: str
) -> None:
    """A revision script the file-name rule would skip, or a gap in the numbers, is a
    refusal (``catalog-schema``), never a chain that silently differs from Alembic's."""
    scripts = tmp_path / "scripts"
    shutil.copytree(schema.SCRIPT_LOCATION, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / stray).write_text("revision = 'x'\n")
    monkeypatch.setattr(schema, "SCRIPT_LOCATION", scripts)
    with pytest.raises(UsageError) as refused:
        schema.chain()
    assert refused.value.check == "catalog-schema"
