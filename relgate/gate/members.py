"""Membership lookups for the gate: which fenced ids or digests are members of a version."""

from __future__ import annotations

from relgate.documents.membership import MembershipCache
from relgate.objects.cas import ContentRef


class CatalogMemberIndex:
    """Scans a version's membership table (a verified local copy) with polars."""

    def __init__(self, cache: MembershipCache) -> None:
        self.cache = cache

    def hits(
        self, members: ContentRef, sample_ids: set[str], content_digests: set[str]
    ) -> tuple[set[str], set[str]]:
        import polars as pl  # noqa: PLC0415 - loads when a fence scans, not at CLI start-up

        frame = (
            self.cache.scan(members)
            .filter(
                pl.col("sampleId").is_in(list(sample_ids))
                | pl.col("logicalContentDigest").is_in(list(content_digests))
            )
            .select("sampleId", "logicalContentDigest")
            .collect()
        )
        ids = set(frame["sampleId"].to_list()) & sample_ids
        digests = set(frame["logicalContentDigest"].to_list()) & content_digests
        return ids, digests
