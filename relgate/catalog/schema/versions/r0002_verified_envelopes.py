"""Migration 2: the verified envelope bytes of snapshots and releases."""

from relgate.catalog.migrations import apply
from relgate.catalog.schema import revision_id

revision = revision_id(2)
down_revision = revision_id(1)
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply(2)
