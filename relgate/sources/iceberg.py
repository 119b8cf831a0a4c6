"""Apache Iceberg tables through pyiceberg, pinned by table snapshot id.

Iceberg snapshot ids are 64-bit, beyond JSON's interoperable integer range, so the
manifest spells them as strings: ``iceberg:<id>``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError

from relgate.errors import NotFoundError, RejectedError
from relgate.integrity.identifiers import problem
from relgate.sources.schema import SOURCE_ARROW_SCHEMA
from relgate.sources.source import IcebergPin, Source, SourceEntry, SourcePin, expect_pin, row_error

COLUMNS = {"sample_id": "sampleId", "lang": "lang", "text": "text"}


def open_catalog(catalog_uri: str, warehouse: str) -> SqlCatalog:
    return SqlCatalog("relgate", uri=catalog_uri, warehouse=warehouse)


class IcebergSource(Source):
    kind = "iceberg"

    def __init__(self, source_id: str, *, catalog_uri: str, warehouse: str, table: str) -> None:
        super().__init__(source_id)
        self.catalog_uri = catalog_uri
        self.warehouse = warehouse
        self.table = table

    def _load(self) -> Any:
        try:
            return open_catalog(self.catalog_uri, self.warehouse).load_table(self.table)
        except NoSuchTableError:
            raise NotFoundError(
                "iceberg table not found", object=f"{self.id}:{self.table}", check="table-exists"
            ) from None

    def pin(self) -> SourcePin:
        table = self._load()
        snapshot = table.current_snapshot()
        if snapshot is None:
            raise RejectedError(
                "iceberg table has no snapshot to pin",
                object=f"{self.id}:{self.table}",
                check="table-snapshot",
            )
        entry = IcebergPin(
            id=self.id, table=self.table, table_snapshot=f"iceberg:{snapshot.snapshot_id}"
        )
        return SourcePin(entry=entry)

    def read(self, entry: SourceEntry) -> pa.Table:
        pin = expect_pin(entry, IcebergPin, self.id)
        table = self._load()
        snapshot_id = pin.snapshot_id
        if table.snapshot_by_id(snapshot_id) is None:
            raise NotFoundError(
                "pinned iceberg snapshot is no longer readable",
                object=f"{self.id}:{self.table}",
                check="source-readable",
                details={"tableSnapshot": pin.table_snapshot},
            )
        data = table.scan(snapshot_id=snapshot_id, selected_fields=tuple(COLUMNS)).to_arrow()
        data = data.rename_columns([COLUMNS[c] for c in data.column_names])
        where = f"{self.id}:{self.table}@{pin.table_snapshot}"
        for name in ("sampleId", "lang", "text"):
            column = data.column(name)
            if column.null_count:
                index = next(i for i, v in enumerate(column.to_pylist()) if v is None)
                raise row_error(f"{where} row {index + 1}", f"field {name!r} is null")
        for index, sample in enumerate(data.column("sampleId").to_pylist()):
            why = problem(sample)
            if why is not None:
                raise row_error(f"{where} row {index + 1}", f"bad id ({why})")
        version = pa.array([pin.table_snapshot] * data.num_rows, pa.string())
        data = data.append_column("sourceVersion", version)
        return data.select(SOURCE_ARROW_SCHEMA.names).cast(SOURCE_ARROW_SCHEMA)

    def check_readable(self, entry: SourceEntry) -> list[str]:
        pin = expect_pin(entry, IcebergPin, self.id)
        try:
            table = self._load()
        except NotFoundError as exc:
            return [str(exc)]
        if table.snapshot_by_id(pin.snapshot_id) is None:
            return [f"{self.id}: iceberg snapshot {pin.table_snapshot} expired"]
        return []
