"""Apache Iceberg tables through pyiceberg, pinned by table snapshot id.

Iceberg snapshot ids are 64-bit, beyond JSON's interoperable integer range, so the
manifest spells them as strings: ``iceberg:<id>``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, StrictStr
from relgate_trust.digests import sha256_digest

from relgate.documents.source_pins import (
    IcebergPin,
    MetadataFile,
    SourceEntry,
    SourcePin,
    expect_pin,
)
from relgate.errors import NotFoundError, RejectedError, RelgateError, UsageError
from relgate.integrity.contract import Contract
from relgate.integrity.identifiers import MAX_ID_BYTES, problem
from relgate.records.record_schema import ID_COLUMN as RECORD_ID
from relgate.records.record_schema import TEXT_SCHEMA, RecordSchema
from relgate.records.rows import row_error
from relgate.records.values import constant_column
from relgate.sources.iceberg_scan import scan_batches
from relgate.sources.source import Source

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.catalog.sql import SqlCatalog

#: The table column that holds the sample id unless the config names another.
ID_COLUMN = "sample_id"


#: Characters :func:`relgate.integrity.identifiers.problem` refuses in an id: Unicode Cc
#: (C0, DEL, C1), Zl, Zp and the bidirectional controls (Cs cannot occur in valid UTF-8).
_REFUSED_ID_CHARS = (
    r"[\x{0}-\x{1f}\x{7f}-\x{9f}\x{2028}\x{2029}\x{61c}\x{200e}\x{200f}"
    r"\x{202a}-\x{202e}\x{2066}-\x{2069}]"
)


def suspect_ids(ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Rows whose id :func:`~relgate.integrity.identifiers.problem` may refuse: empty, too
    long, or holding a refused character (a vectorised superset of the refusals)."""
    size = pc.binary_length(ids)
    return pc.or_(
        pc.or_(pc.equal(size, 0), pc.greater(size, MAX_ID_BYTES)),
        pc.match_substring_regex(ids, _REFUSED_ID_CHARS),
    )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else ""


def _typed(data: pa.Table, schema: RecordSchema, where: str) -> pa.Table:
    """The batch with the record schema's types (a lossless cast, or refused)."""
    fields = [schema.field(name).arrow_field for name in data.column_names]
    try:
        return data.cast(pa.schema(fields), safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise row_error(where, f"columns do not have the record schema's types: {exc}") from None


def _check_batch(data: pa.Table, schema: RecordSchema, where: str, offset: int) -> None:
    """Refuse the first null in a non-nullable column, then the first bad id, naming its
    row in the scan."""
    for spec in schema.fields:
        column = data.column(spec.name)
        if column.null_count and not spec.nullable:
            index = pc.indices_nonzero(pc.is_null(column))[0].as_py()
            raise row_error(f"{where} row {offset + index + 1}", f"field {spec.name!r} is null")
    ids = data.column("sampleId")
    for index in pc.indices_nonzero(suspect_ids(ids)).to_pylist():
        why = problem(ids[index].as_py())
        if why is not None:
            raise row_error(f"{where} row {offset + index + 1}", f"bad id ({why})")


#: The catalog name a source configured by ``catalogUri`` and ``warehouse`` opens (the
#: original form of an Iceberg source: a SQL catalog, kept working as it was).
DEFAULT_CATALOG = "relgate"
#: The catalog could not be loaded or answered with an error (unreachable file or server,
#: unknown type, missing properties).
CATALOG_CHECK = "iceberg-catalog"
#: A record-schema column is not a column of the pinned table.
COLUMNS_CHECK = "source-columns"
#: pyiceberg's catalog type of a process-local catalog, which exists only while the
#: process holds it (so each configuration is loaded once per process).
IN_MEMORY = "in-memory"
_IN_MEMORY_CATALOGS: dict[str, Catalog] = {}


class IcebergCatalog(Contract):
    """Which catalog a source's table is in, as ``pyiceberg.catalog.load_catalog`` takes it:
    the catalog ``name`` and its ``properties`` (``type``: ``sql``, ``rest``, ``glue``,
    ``hive``, ``in-memory``, ... as pyiceberg offers them; ``uri``, ``warehouse``,
    credentials).  Properties not given here come from pyiceberg's own configuration for
    that name (``~/.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__<KEY>``)."""

    name: StrictStr = Field(min_length=1)
    properties: dict[StrictStr, StrictStr] = Field(default_factory=dict)

    @classmethod
    def sql(cls, catalog_uri: str, warehouse: str, name: str = DEFAULT_CATALOG) -> IcebergCatalog:
        """A SQL catalog (the ``catalogUri`` / ``warehouse`` form of a source config)."""
        return cls(
            name=name, properties={"type": "sql", "uri": catalog_uri, "warehouse": warehouse}
        )

    @classmethod
    def from_source_config(cls, config: Mapping[str, object], source_id: str) -> IcebergCatalog:
        """The ``catalog`` of an ``iceberg`` source entry, or its ``catalogUri`` and
        ``warehouse`` (a SQL catalog named ``relgate``); refused when it has neither."""
        if "catalog" in config:
            return cls.parse(config["catalog"], what=f"source {source_id} catalog")
        uri, warehouse = config.get("catalogUri"), config.get("warehouse")
        if not isinstance(uri, str) or not isinstance(warehouse, str):
            raise UsageError(
                "an iceberg source needs `catalog` {name, properties}, or `catalogUri` and"
                " `warehouse` (a SQL catalog)",
                object=f"source {source_id}",
                check=CATALOG_CHECK,
            )
        return cls.sql(uri, warehouse)

    def load(self) -> Catalog:
        """The catalog (an in-memory one: the same instance for the process's life)."""
        # pyiceberg costs ~0.27 s of import; only processes that open a catalog pay it
        from pyiceberg.catalog import load_catalog  # noqa: PLC0415 - see above

        if self.properties.get("type") != IN_MEMORY:
            return load_catalog(self.name, **self.properties)
        key = self.digest()
        if key not in _IN_MEMORY_CATALOGS:
            _IN_MEMORY_CATALOGS[key] = load_catalog(self.name, **self.properties)
        return _IN_MEMORY_CATALOGS[key]


def open_catalog(catalog_uri: str, warehouse: str) -> SqlCatalog:
    """The SQL catalog ``relgate`` a ``catalogUri`` / ``warehouse`` source config names."""
    from pyiceberg.catalog.sql import SqlCatalog  # noqa: PLC0415 - lazy, as IcebergCatalog.load

    return SqlCatalog(DEFAULT_CATALOG, uri=catalog_uri, warehouse=warehouse)


class IcebergSource(Source):
    kind = "iceberg"

    def __init__(
        self,
        source_id: str,
        *,
        catalog: IcebergCatalog,
        table: str,
        schema: RecordSchema = TEXT_SCHEMA,
        id_column: str = ID_COLUMN,
    ) -> None:
        super().__init__(source_id, schema=schema)
        self.catalog = catalog
        self.table = table
        self.id_column = id_column
        #: table column -> record column
        self.columns = {
            (id_column if name == RECORD_ID else name): name for name in schema.column_names
        }

    def _catalog(self) -> Catalog:
        try:
            return self.catalog.load()
        except RelgateError:
            raise  # a refusal of ours (a half-filled config) keeps its own check
        except Exception as exc:  # pyiceberg and its drivers raise many kinds: all say "cannot"
            raise NotFoundError(
                f"iceberg catalog {self.catalog.name!r} cannot be opened"
                f" ({type(exc).__name__}): {_first_line(exc)}",
                object=f"{self.id}:catalog {self.catalog.name}",
                check=CATALOG_CHECK,
            ) from None

    def _load(self) -> Any:
        from pyiceberg.exceptions import (  # noqa: PLC0415 - lazy, as IcebergCatalog.load
            NoSuchNamespaceError,
            NoSuchTableError,
        )

        catalog = self._catalog()
        try:
            return catalog.load_table(self.table)
        except (NoSuchTableError, NoSuchNamespaceError):
            raise NotFoundError(
                f"iceberg table not found in catalog {self.catalog.name!r}",
                object=f"{self.id}:{self.table}",
                check="table-exists",
            ) from None
        except RelgateError:
            raise
        except Exception as exc:  # the catalog answered with an error: unreachable, refused
            raise NotFoundError(
                f"iceberg catalog {self.catalog.name!r} could not load the table"
                f" ({type(exc).__name__}): {_first_line(exc)}",
                object=f"{self.id}:{self.table}",
                check=CATALOG_CHECK,
            ) from None

    def _require_columns(self, table: Any, schema_id: int | None, where: str) -> None:
        """Refuse a record-schema column the table (at that schema) does not have."""
        schema = table.schemas().get(schema_id) if schema_id is not None else None
        schema = schema or table.schema()
        present = {field.name for field in schema.fields}
        missing = sorted(name for name in self.columns if name not in present)
        if missing:
            raise RejectedError(
                f"the record schema's columns {missing} are not columns of the iceberg table",
                object=where,
                check=COLUMNS_CHECK,
                details={"missing": missing, "tableColumns": sorted(present)},
            )

    def pin(self) -> SourcePin:
        table = self._load()
        snapshot = table.current_snapshot()
        if snapshot is None:
            raise RejectedError(
                "iceberg table has no snapshot to pin",
                object=f"{self.id}:{self.table}",
                check="table-snapshot",
            )
        self._require_columns(table, snapshot.schema_id, f"{self.id}:{self.table}")
        entry = IcebergPin(
            id=self.id,
            table=self.table,
            table_snapshot=f"iceberg:{snapshot.snapshot_id}",
            metadata_file=self._metadata_file(table),
        )
        return SourcePin(entry=entry)

    def _metadata_file(self, table: Any) -> MetadataFile:
        """The current metadata file's location and byte digest (read once, through the
        table's own FileIO, so S3 and local warehouses alike)."""
        location = str(table.metadata_location)
        try:
            with table.io.new_input(location).open() as stream:
                data = stream.read()
        except (OSError, ValueError) as exc:
            raise NotFoundError(
                f"iceberg metadata file is not readable: {exc}",
                object=f"{self.id}:{location}",
                check="source-readable",
            ) from None
        return MetadataFile(location=location, digest=sha256_digest(data), size=len(data))

    def read(self, entry: SourceEntry) -> pa.Table:
        tables = list(self.read_batches(entry))
        if not tables:
            return self.schema.arrow_schema().empty_table()
        return pa.concat_tables(tables)

    def read_batches(self, entry: SourceEntry) -> Iterator[pa.Table]:
        """The pinned snapshot's rows in record batches, each checked before it is yielded."""
        pin = expect_pin(entry, IcebergPin, self.id)
        table = self._load()
        snapshot_id = pin.snapshot_id
        snapshot = table.snapshot_by_id(snapshot_id)
        if snapshot is None:
            raise NotFoundError(
                "pinned iceberg snapshot is no longer readable",
                object=f"{self.id}:{self.table}",
                check="source-readable",
                details={"tableSnapshot": pin.table_snapshot},
            )
        where = f"{self.id}:{self.table}@{pin.table_snapshot}"
        self._require_columns(table, snapshot.schema_id, where)
        scan = table.scan(snapshot_id=snapshot_id, selected_fields=tuple(self.columns))
        arrow_schema = self.schema.arrow_schema()
        offset = 0
        for batch in scan_batches(scan):
            data = pa.Table.from_batches([batch])
            data = data.rename_columns([self.columns[c] for c in data.column_names])
            data = _typed(data.select(list(self.schema.column_names)), self.schema, where)
            _check_batch(data, self.schema, where, offset)
            offset += data.num_rows
            version = constant_column(pin.table_snapshot, data.num_rows)
            data = data.append_column("sourceVersion", version)
            yield data.cast(arrow_schema)

    def check_readable(self, entry: SourceEntry) -> list[str]:
        pin = expect_pin(entry, IcebergPin, self.id)
        try:
            table = self._load()
        except NotFoundError as exc:
            return [str(exc)]
        if table.snapshot_by_id(pin.snapshot_id) is None:
            return [f"{self.id}: iceberg snapshot {pin.table_snapshot} expired"]
        return []
