"""The base of every typed contract: a frozen, camelCase, closed pydantic model.

A document or record that crosses a module boundary (a manifest, a member tuple, a shard
descriptor, a report, a permit, a run, a pin, a command result) is a :class:`Contract`.
Its JSON is produced from the model, never from a hand-built dict: :meth:`Contract.to_json`
gives the camelCase object, :meth:`Contract.canonical` its RFC 8785 bytes and
:meth:`Contract.digest` their ``sha256:`` digest.  Unknown fields are refused on input
(``extra="forbid"``), so a hostile or drifted document fails validation instead of being
carried along.
"""

from __future__ import annotations

from typing import Any, Self, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel
from relgate_trust.digests import sha256_digest

from relgate.errors import RejectedError
from relgate.integrity.canonical import canonical_bytes

#: A JSON value as the standard library decodes it.
JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None
#: A decoded JSON object (the untyped boundary before validation into a model).
JsonObject: TypeAlias = dict[str, JsonValue]


class Contract(BaseModel):
    """Frozen, closed, camelCase on the wire; snake_case in Python."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        strict=False,
    )

    def to_json(self, *, exclude_none: bool = False) -> dict[str, Any]:
        """The wire object: camelCase keys, JSON-native values."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=exclude_none)

    def canonical(self, *, exclude_none: bool = False) -> bytes:
        """RFC 8785 bytes of :meth:`to_json` (floats and big integers refused)."""
        return canonical_bytes(self.to_json(exclude_none=exclude_none))

    def digest(self, *, exclude_none: bool = False) -> str:
        """``sha256:<hex>`` of :meth:`canonical`."""
        return sha256_digest(self.canonical(exclude_none=exclude_none))

    @classmethod
    def parse(cls, value: object, *, what: str | None = None) -> Self:
        """Validate a decoded JSON value into the model.

        The value came from outside (a file, a store, a peer): a mismatch is a refusal
        (exit 3) that names the object and the first failing field, not an internal error.
        """
        return _validated(cls, value, what)


class Record(BaseModel):
    """A typed row of the catalog: frozen, closed, camelCase on the wire like a
    :class:`Contract`, but not a document (it has no canonical form and no digest of its
    own, so ``digest`` is free to be a field: most rows are keyed by one)."""

    model_config = Contract.model_config

    def to_json(self) -> dict[str, Any]:
        """The wire object: camelCase keys, JSON-native values."""
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def parse(cls, value: object, *, what: str | None = None) -> Self:
        """Validate a row into the record; a row that does not fit (a hand-edited catalog)
        is a refusal (check ``schema``, exit 3), not an internal error."""
        return _validated(cls, value, what)


_Model = TypeVar("_Model", bound=BaseModel)


def _validated(cls: type[_Model], value: object, what: str | None) -> _Model:
    try:
        return cls.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise RejectedError(
            f"{what or cls.__name__}: {first.get('msg', 'invalid')} at {where or '$'}",
            object=what or cls.__name__,
            check="schema",
        ) from exc
