"""Declared readers: who reads a release's records, which columns, as which types.

A workspace declares its readers in ``relgate.json`` (``readers:``, validated when the
config is read)::

    "readers": [
      {"name": "trainer-v3",
       "requires": [{"name": "sampleId", "type": "string"},
                    {"name": "text", "type": "string"}],
       "optional": [{"name": "lang", "type": "string", "nullable": true}],
       "acceptsWidening": true}
    ]

``type`` is the canonical type name the reader reads the column as (the record-schema
grammar, :func:`relgate.records.record_schema.arrow_type`); ``nullable: true`` says the
reader copes with nulls in it (default false).  ``acceptsWidening`` says whether the
reader still reads a column whose type became wider than the one it declares
(:func:`relgate.release.evolution.widens`).  A reader's identity in a schema-evolution
report is its name plus the digest of its declaration, so a changed declaration is a
different reader until the release is verified again.
"""

from __future__ import annotations

from typing import Self

from pydantic import Field, StrictBool, StrictStr, model_validator

from relgate.integrity.contract import Contract
from relgate.records.record_schema import FieldSpec


class ReaderColumn(FieldSpec):
    """One column a reader reads: its name, the type it reads it as (checked against the
    record-schema type grammar) and whether it copes with nulls; never a rename."""

    @model_validator(mode="after")
    def _no_rename(self) -> Self:
        if self.renamed_from is not None:
            raise ValueError("a reader column declares no renamedFrom")
        return self


class ReaderSpec(Contract):
    """A declared reader (see the module docstring)."""

    name: StrictStr = Field(min_length=1, max_length=128)
    requires: tuple[ReaderColumn, ...] = Field(min_length=1)
    optional: tuple[ReaderColumn, ...] = ()
    accepts_widening: StrictBool = False

    @model_validator(mode="after")
    def _columns_once(self) -> Self:
        names = [c.name for c in (*self.requires, *self.optional)]
        if len(set(names)) != len(names):
            raise ValueError(f"reader {self.name!r} names a column twice")
        return self

    @property
    def columns(self) -> tuple[tuple[ReaderColumn, bool], ...]:
        """Every column with whether it is required."""
        return (*((c, True) for c in self.requires), *((c, False) for c in self.optional))
