"""Who owns the assets and how they are tagged: one place, so every asset says the same.

The owner is the team that answers for the data gate (the UI filters, and alerting
routes, by owner); the tag ``relgate/area`` names the asset's group (sources, snapshots,
nightly, releases, checkpoints, lifecycle), so the catalog can be searched by area.
"""

from __future__ import annotations

#: The owners of every relgate asset.
OWNERS = ["team:data-platform"]
AREA_TAG = "relgate/area"


def tags_for(group: str) -> dict[str, str]:
    """The tags of an asset in ``group``."""
    return {AREA_TAG: group}
