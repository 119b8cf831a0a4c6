"""Data centers: the enrollment label that names a host's DC, and how a fleet of numbered
racks is split into DCs (the lab's and the demo fleet's rule: contiguous blocks)."""

from __future__ import annotations

from collections.abc import Mapping

#: The enrollment label that names a host's data center (never what the host claims).
DC_LABEL = "dc"


def host_dc(labels: Mapping[str, str]) -> str:
    """A host's data center from its enrollment labels ("" when it has none)."""
    return labels.get(DC_LABEL, "")


def rack_dc(rack: int, racks: int, dcs: int) -> str:
    """The DC of rack number ``rack`` of ``racks`` split into ``dcs`` contiguous blocks
    ("dc0", "dc1", ...; "" with one DC)."""
    if dcs <= 1:
        return ""
    return f"dc{rack * dcs // racks}"


def with_dc(labels: str, dc: str) -> str:
    """``k=v,...`` labels plus ``dc=<dc>`` (unchanged for "")."""
    if not dc:
        return labels
    return f"{labels},{DC_LABEL}={dc}" if labels else f"{DC_LABEL}={dc}"


__all__ = ["DC_LABEL", "host_dc", "rack_dc", "with_dc"]
