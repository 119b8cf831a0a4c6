"""Migration 1: the baseline schema of 0.1.0 (``relgate.catalog.migrations``)."""

from relgate.catalog.migrations import apply
from relgate.catalog.schema import revision_id

revision = revision_id(1)
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply(1)
