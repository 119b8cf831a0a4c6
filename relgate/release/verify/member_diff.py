"""The full multiset diff of a release's decoded member tuples against its snapshot.

Missing, extra, duplicate, content substitution, sourceVersion substitution and split
conflicts, each counted under its :class:`~relgate.release.verify.checks.Check`.
"""

from __future__ import annotations

import polars as pl

from relgate.release.verify.checks import Check

#: The member tuple as the verifier compares it.
TUPLE_SCHEMA = {
    "sampleId": pl.String,
    "sourceId": pl.String,
    "sourceVersion": pl.String,
    "logicalContentDigest": pl.String,
    "split": pl.String,
}


def set_diff(release: pl.DataFrame, snapshot: pl.DataFrame) -> dict[Check, int]:
    """Full multiset diff of the decoded tuples against the snapshot's membership."""
    per_id = release.group_by("sampleId").agg(
        pl.len().alias("n"), pl.col("split").n_unique().alias("splits")
    )
    duplicates = int(per_id.filter(pl.col("n") > 1).select((pl.col("n") - 1).sum()).item() or 0)
    split_in_release = per_id.filter(pl.col("splits") > 1).height
    first = release.unique(subset="sampleId", keep="first", maintain_order=True)
    joined = first.join(snapshot, on="sampleId", how="full", suffix="_snap", coalesce=True)
    both = joined.filter(pl.col("sourceId").is_not_null() & pl.col("sourceId_snap").is_not_null())
    return {
        Check.MISSING_MEMBERS: joined.filter(pl.col("sourceId").is_null()).height,
        Check.EXTRA_MEMBERS: joined.filter(pl.col("sourceId_snap").is_null()).height,
        Check.DUPLICATE_MEMBERS: duplicates,
        Check.CONTENT_SUBSTITUTIONS: both.filter(
            pl.col("logicalContentDigest") != pl.col("logicalContentDigest_snap")
        ).height,
        Check.SOURCE_VERSION_SUBSTITUTIONS: both.filter(
            (pl.col("sourceVersion") != pl.col("sourceVersion_snap"))
            | (pl.col("sourceId") != pl.col("sourceId_snap"))
        ).height,
        Check.SPLIT_CONFLICTS: both.filter(pl.col("split") != pl.col("split_snap")).height
        + split_in_release,
    }
