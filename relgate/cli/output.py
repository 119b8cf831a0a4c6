"""The output layer of every ``relgate`` command: one JSON style (camelCase keys), one place.

A command returns a mapping, a :class:`~relgate.integrity.contract.Contract` model (its
``to_json()`` is used) or a :class:`~relgate.cli.common.CommandResult` around either.  Before
anything is printed, :func:`to_wire` turns the value into plain JSON with every object key in
camelCase: ``member_count`` becomes ``memberCount`` at any depth, keys already in camelCase
(or kebab-case, like check names) are left alone.  Maps whose keys are data (source ids,
digests, split names) keep their keys, their values are still converted; a stored
document (a signed manifest body, a saved reader position) is printed as stored.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

import click
from rich.console import Console
from rich.text import Text
from rich.tree import Tree

if TYPE_CHECKING:
    from relgate.integrity.contract import JsonObject, JsonValue


class JsonModel(Protocol):
    """A typed result that knows its wire object: a ``Contract`` model, a record dataclass."""

    def to_json(self) -> Mapping[str, object]: ...


#: What a command may return: a JSON-like mapping or a model with ``to_json()``.
Payload: TypeAlias = "Mapping[str, object] | JsonModel"

#: A snake_case identifier (``bytes_moved``, ``hosts_total``): the only keys renamed.
_SNAKE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")

#: Object keys whose value is a map keyed by data (source ids, split names, tags, roles,
#: check names, digests), not by field names: those keys are printed as they are.
DATA_MAPS = frozenset(
    {
        "bySource",
        "bySplit",
        "splits",
        "splitMigrations",
        "perSource",
        "perSplit",
        "failedChecks",
        "checks",
        "transformTags",
        "keys",
        "current",
        "excluded",
        "hits",
        "labels",
    }
)

#: Object keys whose value is a stored document shown byte-for-byte as the store holds it
#: (a signed manifest body, a saved reader position that ``pin add`` reads back, a signed
#: in-toto statement, whose ``_type`` is the spec's spelling).
VERBATIM = frozenset({"manifest", "position", "statement"})


def camel(key: str) -> str:
    """``bytes_moved`` -> ``bytesMoved``; anything that is not snake_case is returned as is."""
    if not _SNAKE.fullmatch(key):
        return key
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _plain(value: object) -> object:
    """A model or dataclass as its JSON object; anything else unchanged."""
    to_json = getattr(value, "to_json", None)
    if callable(to_json) and not isinstance(value, type):
        return to_json()
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return value


def _verbatim(value: object) -> JsonValue:
    """A stored document as plain JSON with its own keys (through the json module)."""
    loaded: JsonValue = json.loads(json.dumps(_plain(value), default=str))
    return loaded


def _convert(value: object, *, data_keys: bool = False) -> JsonValue:
    value = _plain(value)
    if isinstance(value, Mapping):
        out: JsonObject = {}
        for key, item in value.items():
            name = str(key) if data_keys else camel(str(key))
            if name in VERBATIM and not data_keys:
                out[name] = _verbatim(item)
            else:
                out[name] = _convert(item, data_keys=name in DATA_MAPS and not data_keys)
        return out
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [_convert(item) for item in items]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)  # datetimes, paths, enums: their text


def to_wire(value: Payload) -> JsonObject:
    """The one JSON object a command prints: plain values, camelCase keys."""
    converted = _convert(value)
    if not isinstance(converted, dict):
        raise TypeError(f"a command result must be a JSON object, not {type(converted).__name__}")
    return converted


def print_json(obj: JsonObject) -> None:
    click.echo(json.dumps(obj, sort_keys=True))


def _branch(tree: Tree, value: JsonValue) -> None:
    """``value``'s items as children of ``tree``: ``key: value`` leaves, nested branches."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                _branch(tree.add(Text(f"{key}:")), item)
            else:
                tree.add(Text(f"{key}: {_scalar(item)}"))
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict | list) and item:
                _branch(tree.add(Text("-")), item)
            else:
                tree.add(Text(f"- {_scalar(item)}"))


def _scalar(value: JsonValue) -> str:
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def print_human(value: JsonValue) -> None:
    """The same object as a tree of ``key: value`` lines (without ``--json``), drawn by
    rich; lines never wrap (digests stay whole and greppable) and no markup is read from
    the values."""
    console = Console(file=sys.stdout, width=1 << 12, soft_wrap=True, highlight=False, emoji=False)
    if isinstance(value, dict | list):
        tree = Tree(Text(""), hide_root=True, guide_style="dim")
        _branch(tree, value)
        console.print(tree)
    else:
        console.print(Text(str(value)))
