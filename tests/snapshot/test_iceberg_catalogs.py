"""Bring your own Iceberg catalog: a source names a pyiceberg catalog by name and properties
(``load_catalog``), not only the SQL catalog ``relgate``; a catalog that cannot be opened
and a record-schema column the table lacks are refusals naming the source and the check."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner, Result
from support.workspaces import make_workspace

from relgate.cli.main import main
from relgate.sources.iceberg import CATALOG_CHECK, COLUMNS_CHECK, IcebergCatalog
from relgate.workspace import Workspace

ROWS = 12
TEXT_COLUMNS = pa.schema([("sample_id", pa.string()), ("lang", pa.string()), ("text", pa.string())])


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    workspace = make_workspace(tmp_path / "home", seed=False)
    yield workspace
    workspace.close()


def cli(ws: Workspace, *args: str) -> Result:
    return CliRunner().invoke(main, ["--home", str(ws.home), *args, "--json"])


def _table(catalog: IcebergCatalog, name: str, schema: pa.Schema = TEXT_COLUMNS) -> None:
    """``name`` in ``catalog`` with ROWS rows of ``schema``'s columns."""
    opened = catalog.load()
    namespace = name.partition(".")[0]
    if (namespace,) not in opened.list_namespaces():
        opened.create_namespace(namespace)
    table = opened.create_table(name, schema=schema)
    values = {
        "sample_id": [f"byo/{i:04d}" for i in range(ROWS)],
        "lang": ["en"] * ROWS,
        "text": [f"a ticket about the printer, number {i}" for i in range(ROWS)],
    }
    table.append(pa.table({f.name: values[f.name] for f in schema}, schema=schema))


def _use(ws: Workspace, source: dict[str, object]) -> None:
    ws.config["sources"] = [{"id": "byo", "kind": "iceberg", **source}]
    ws.save()


def _built(ws: Workspace) -> dict[str, object]:
    result = cli(ws, "snapshot", "build", "--alias", "byo")
    assert result.exit_code == 0, result.output
    body: dict[str, object] = json.loads(result.stdout)
    return body


def _refused(ws: Workspace, code: int = 3) -> dict[str, object]:
    result = cli(ws, "snapshot", "build", "--alias", "byo")
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    body: dict[str, object] = json.loads(result.stdout)
    return body


def _sql(tmp_path: Path, name: str, db: str = "acme.db") -> IcebergCatalog:
    (tmp_path / "warehouse").mkdir(exist_ok=True)
    uri, warehouse = f"sqlite:///{tmp_path / db}", f"file://{tmp_path / 'warehouse'}"
    return IcebergCatalog.sql(uri, warehouse, name=name)


def test_a_sql_catalog_under_another_name(ws: Workspace, tmp_path: Path) -> None:
    acme = _sql(tmp_path, "acme")
    _table(acme, "sales.tickets")
    # The old form opens the catalog "relgate" on the same file: no such table there.
    props = acme.properties
    _use(
        ws, {"table": "sales.tickets", "catalogUri": props["uri"], "warehouse": props["warehouse"]}
    )
    assert _refused(ws)["check"] == "table-exists"
    _use(ws, {"table": "sales.tickets", "catalog": acme.to_json()})
    built = _built(ws)
    assert (built["members"], built["state"]) == (ROWS, "VALIDATED")


def test_an_in_memory_catalog(ws: Workspace, tmp_path: Path) -> None:
    """pyiceberg's in-memory catalog: it lives as long as the process, which loads each
    configured one once (the CLI runs in this process here)."""
    (tmp_path / "mem").mkdir()
    memory = IcebergCatalog(
        name="scratch", properties={"type": "in-memory", "warehouse": f"file://{tmp_path / 'mem'}"}
    )
    _table(memory, "lab.tickets")
    assert memory.load() is memory.load()
    _use(ws, {"table": "lab.tickets", "catalog": memory.to_json()})
    built = _built(ws)
    assert (built["members"], built["state"]) == (ROWS, "VALIDATED")


def test_the_original_catalog_form_still_builds(ws: Workspace, tmp_path: Path) -> None:
    relgate = _sql(tmp_path, "relgate", "relgate.db")
    _table(relgate, "corpus.tickets")
    props = relgate.properties
    _use(
        ws, {"table": "corpus.tickets", "catalogUri": props["uri"], "warehouse": props["warehouse"]}
    )
    assert _built(ws)["members"] == ROWS


def test_an_unreachable_catalog_file_is_refused(ws: Workspace, tmp_path: Path) -> None:
    gone = tmp_path / "no-such-dir" / "catalog.db"
    _use(ws, {"table": "t.x", "catalogUri": f"sqlite:///{gone}", "warehouse": f"file://{tmp_path}"})
    body = _refused(ws)
    assert (body["check"], body["object"]) == (CATALOG_CHECK, "byo:catalog relgate")
    _use(ws, {"table": "t.x", "catalog": {"name": "x", "properties": {"type": "no-such-type"}}})
    assert _refused(ws)["check"] == CATALOG_CHECK
    _use(ws, {"table": "t.x", "catalog": {"name": "x", "properties": {"uri": 7}}})
    assert _refused(ws)["check"] == "schema"  # properties are strings
    _use(ws, {"table": "t.x"})
    assert _refused(ws, 2)["check"] == CATALOG_CHECK


def test_a_record_column_missing_from_the_table_is_refused(ws: Workspace, tmp_path: Path) -> None:
    acme = _sql(tmp_path, "acme")
    _table(acme, "sales.tickets", pa.schema([("sample_id", pa.string()), ("text", pa.string())]))
    _use(ws, {"table": "sales.tickets", "catalog": acme.to_json()})
    body = _refused(ws)
    assert (body["check"], body["object"]) == (COLUMNS_CHECK, "byo:sales.tickets")
    assert body["details"]["missing"] == ["lang"]  # type: ignore[index]


def test_a_pinned_snapshot_is_read_with_its_own_schema(ws: Workspace, tmp_path: Path) -> None:
    """A column dropped and a commit after pinning: the pinned snapshot still validates (it
    is read with the schema it was written with); the next build is refused source-columns."""
    acme = _sql(tmp_path, "acme")
    _table(acme, "sales.tickets")
    _use(ws, {"table": "sales.tickets", "catalog": acme.to_json()})
    digest = str(_built(ws)["snapshot"])
    table = acme.load().load_table("sales.tickets")
    with table.update_schema() as update:
        update.delete_column("lang")
    narrow = pa.schema([("sample_id", pa.string()), ("text", pa.string())])
    table.append(pa.table({"sample_id": ["byo/new"], "text": ["a later ticket"]}, schema=narrow))
    validated = cli(ws, "snapshot", "validate", digest)
    assert validated.exit_code == 0 and json.loads(validated.stdout)["outcome"] == "VALIDATED"
    assert _refused(ws)["check"] == COLUMNS_CHECK


def test_a_table_the_catalog_cannot_load_is_refused(ws: Workspace, tmp_path: Path) -> None:
    """The catalog opens but loading the table fails: its metadata file is gone."""
    acme = _sql(tmp_path, "acme")
    _table(acme, "sales.tickets")
    location = acme.load().load_table("sales.tickets").metadata_location
    Path(location.removeprefix("file://")).unlink()
    _use(ws, {"table": "sales.tickets", "catalog": acme.to_json()})
    body = _refused(ws)
    assert (body["check"], body["object"]) == (CATALOG_CHECK, "byo:sales.tickets")


def test_a_half_configured_catalog_is_a_usage_error(ws: Workspace, tmp_path: Path) -> None:
    _use(ws, {"table": "t.x", "catalogUri": f"sqlite:///{tmp_path / 'c.db'}"})  # no warehouse
    assert _refused(ws, 2)["check"] == CATALOG_CHECK
    _use(ws, {"table": "t.x", "warehouse": f"file://{tmp_path}"})  # no catalogUri
    assert _refused(ws, 2)["check"] == CATALOG_CHECK
    _use(ws, {"table": "t.x", "catalog": {"name": "", "properties": {"type": "sql"}}})
    assert _refused(ws)["check"] == "schema"  # a catalog has a name
