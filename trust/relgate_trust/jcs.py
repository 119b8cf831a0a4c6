"""RFC 8785 (JSON Canonicalization Scheme) bytes: one encoder for the agent and the core.

``rfc8785`` is the reference and is pure Python: a few microseconds per JSON node, which
makes canonicalization the dominant cost of opening a large manifest.  For the documents
this project signs (objects, arrays, strings, booleans, null and integers) RFC 8785's output
is exactly ``json.dumps`` with sorted keys, no whitespace and no ASCII escaping, provided:
- no float appears (RFC 8785 spells numbers the ECMAScript way);
- no integer is outside +-(2**53 - 1) (``rfc8785`` refuses those);
- object keys sort the same by UTF-16 code units (RFC 8785) as by code points (Python):
  true unless a key holds a character at or above U+D800;
- every value is of the exact built-in type (no subclasses: enums, bool-likes);
- the text encodes to UTF-8 (no lone surrogates).
:func:`dumps` checks these in one walk and uses the C encoder when they hold; otherwise it
hands the value to ``rfc8785`` unchanged, so every refusal and every exotic spelling is the
reference's.  Byte identity with ``rfc8785`` is a hypothesis property (tests/test_jcs.py).
"""

from __future__ import annotations

import json
from typing import Any

import rfc8785

#: Largest integer RFC 8785 (and every JSON implementation using doubles) represents exactly.
MAX_SAFE_INTEGER = 2**53 - 1
_SURROGATES_AND_ABOVE = "\ud800"
_ENCODER = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
)


def _simple(value: Any) -> bool:
    """True when ``value`` holds only exact built-in JSON types and safe integers (one walk,
    no recursion).  Object keys are checked for sort order separately, on the output."""
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int:
            if not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                return False
        elif kind is dict:
            for key, child in item.items():
                if type(key) is not str:
                    return False
                push(child)
        elif kind is list or kind is tuple:
            extend(item)
        else:
            return False
    return True


def _keys_sort_alike(value: Any) -> bool:
    """No object key holds a character at or above U+D800 (where UTF-16 order differs)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            for key, child in item.items():
                if key and max(key) >= _SURROGATES_AND_ABOVE:
                    return False
                stack.append(child)
        elif type(item) is list or type(item) is tuple:
            stack.extend(item)
    return True


def dumps(value: Any) -> bytes:
    """RFC 8785 canonical bytes of a JSON value (byte-identical to ``rfc8785.dumps``)."""
    if _simple(value):
        try:
            text = _ENCODER.encode(value)
            if text.isascii() or _keys_sort_alike(value):
                return text.encode("utf-8")
        except (UnicodeEncodeError, RecursionError):
            pass  # a lone surrogate or absurd nesting: the reference decides
    encoded: bytes = rfc8785.dumps(value)
    return encoded
