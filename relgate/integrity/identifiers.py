"""One rule for identifiers (sample ids, source ids, tombstone ids), written once.

An identifier is hostile input until it passes :func:`validate_id`:

* it is text (``str``), or bytes that decode as strict UTF-8;
* it is not empty;
* its UTF-8 encoding is at most :data:`MAX_ID_BYTES` bytes (no lone surrogates: argv
  bytes that are not UTF-8 arrive as surrogate escapes and are refused here);
* it holds no control character (Unicode category ``Cc``: NUL, C0, DEL, C1), no line or
  paragraph separator (``Zl``/``Zp``) and no bidirectional override/isolate (which make
  a log line or a review screen show another id than the one stored).

Every string given on the ``relgate`` command line (names, reasons, paths) passes the
character part of the same rule (:func:`validate_text`) before a command runs, so nothing
stored or printed from there holds a control character or a terminal escape.

Identifiers are *values*, never paths: nothing in relgate builds a file name or object
key from a sample or source id (keys are digests), so ``../../etc/passwd`` is a legal
sample id that stays a string.  Refusals are :class:`IdentifierError` (exit 3, check
``identifier``) naming where the id came from, never echoing more than a bounded,
escaped prefix of it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from typing import Any

from relgate.errors import RejectedError

MAX_ID_BYTES = 512
CHECK = "identifier"
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_REFUSED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})


class IdentifierError(RejectedError):
    code = "rejected"


_SHOWN_CHARS = 80


def _shown(value: Any) -> str:
    """A bounded, escaped rendering for error messages (never the raw bytes)."""
    text = ascii(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def problem(value: Any) -> str | None:
    """Why ``value`` is not a valid identifier, or ``None`` if it is one."""
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return "not valid UTF-8"
    if not isinstance(value, str):
        return f"not a string ({type(value).__name__})"
    if not value:
        return "empty"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "not valid UTF-8 (lone surrogate)"
    if size > MAX_ID_BYTES:
        return f"longer than {MAX_ID_BYTES} UTF-8 bytes ({size})"
    return control_problem(value)


def control_problem(value: str) -> str | None:
    """Why ``value`` may not be shown or stored as a name: the character part of the rule
    (a control character, which includes a terminal escape's ESC, a line/paragraph
    separator, a bidi override, a lone surrogate), or ``None``."""
    for ch in value:
        if ch in _BIDI or unicodedata.category(ch) in _REFUSED_CATEGORIES:
            return f"holds control character U+{ord(ch):04X}"
    return None


def validate_text(value: str, *, kind: str, where: str) -> str:
    """Free text (a name, a reason, a path given on the command line) that passes the
    character part of the rule; :class:`IdentifierError` naming ``where`` otherwise."""
    why = control_problem(value)
    if why is not None:
        raise IdentifierError(
            f"invalid {kind}: {why}",
            object=where,
            check=CHECK,
            details={"kind": kind, "value": _shown(value), "reason": why},
        )
    return value


def validate_id(value: Any, *, kind: str = "sample id", where: str | None = None) -> str:
    """The identifier as ``str``, or :class:`IdentifierError` naming ``where`` it came from."""
    why = problem(value)
    if why is not None:
        raise IdentifierError(
            f"invalid {kind}: {why}",
            object=where or kind,
            check=CHECK,
            details={"kind": kind, "value": _shown(value), "reason": why},
        )
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8")
    return str(value)  # problem() accepted it, so it is a str already


def validate_ids(
    values: Iterable[Any], *, kind: str = "sample id", where: str | None = None
) -> list[str]:
    out = []
    for index, value in enumerate(values):
        out.append(validate_id(value, kind=kind, where=f"{where or kind} #{index}"))
    return out


__all__ = [
    "CHECK",
    "MAX_ID_BYTES",
    "IdentifierError",
    "control_problem",
    "problem",
    "validate_id",
    "validate_ids",
    "validate_text",
]
