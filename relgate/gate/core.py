"""Compatibility path: the gate's names, re-exported from the modules that hold them.

:class:`~relgate.gate.gate.Gate` lives in :mod:`relgate.gate.gate`, the alias CAS in
:mod:`relgate.gate.aliases`, fences in :mod:`relgate.gate.fences`, hits in
:mod:`relgate.gate.hits` and stored-envelope re-verification in
:mod:`relgate.gate.envelopes`.
"""

from __future__ import annotations

from relgate.gate.aliases import AliasChange, AliasHistoryEntry, AliasState, read_alias
from relgate.gate.envelopes import EnvelopeVerifier, StoredEnvelopes
from relgate.gate.fences import (
    BenchmarkEntry,
    FenceAdvance,
    Fences,
    TombstoneEntry,
    fenced_entries,
    read_fences,
)
from relgate.gate.gate import ACTIVATION, Gate, HitListener
from relgate.gate.hits import HitRecord, MemberIndex

__all__ = [
    "ACTIVATION",
    "AliasChange",
    "AliasHistoryEntry",
    "AliasState",
    "BenchmarkEntry",
    "EnvelopeVerifier",
    "FenceAdvance",
    "Fences",
    "Gate",
    "HitListener",
    "HitRecord",
    "MemberIndex",
    "StoredEnvelopes",
    "TombstoneEntry",
    "fenced_entries",
    "read_alias",
    "read_fences",
]
