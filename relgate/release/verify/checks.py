"""The verifier's checks: one name per count a verification report carries.

:class:`Check` is the single spelling of every check.  The verifier counts failures under
these names (the keys of the report's ``counts``), and the Dagster asset checks are built
from the same enum, so a check that is not emitted cannot be watched (and vice versa).
The values are the exact strings stored in reports; the stored format does not change.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class Check(StrEnum):
    """Every count of a verification report; each must be zero for VERIFIED."""

    # Per shard: each counts the shards that failed it.
    OBJECT_UNAVAILABLE = "objectUnavailable"
    KEY_UNAVAILABLE = "keyUnavailable"
    SIZE_MISMATCH = "sizeMismatch"
    STORAGE_DIGEST_MISMATCH = "storageDigestMismatch"
    DECRYPT_FAILURES = "decryptFailures"
    FOOTER_UNREADABLE = "footerUnreadable"
    RECORD_SCHEMA_MISMATCH = "recordSchemaMismatch"
    DECODE_FAILURES = "decodeFailures"
    LOGICAL_DIGEST_MISMATCH = "logicalDigestMismatch"
    RECORD_COUNT_MISMATCH = "recordCountMismatch"
    TOKEN_COUNT_MISMATCH = "tokenCountMismatch"  # noqa: S105 - a check name, not a secret
    MEMBER_SET_DIGEST_MISMATCH = "memberSetDigestMismatch"
    # Release-wide.
    DESCRIPTOR_INCOMPLETE = "descriptorIncomplete"
    MIXED_RECORD_SCHEMAS = "mixedRecordSchemas"
    STORED_CONTENT_DIGEST_MISMATCHES = "storedContentDigestMismatches"
    MISSING_MEMBERS = "missingMembers"
    EXTRA_MEMBERS = "extraMembers"
    DUPLICATE_MEMBERS = "duplicateMembers"
    CONTENT_SUBSTITUTIONS = "contentSubstitutions"
    SOURCE_VERSION_SUBSTITUTIONS = "sourceVersionSubstitutions"
    SPLIT_CONFLICTS = "splitConflicts"
    TUPLE_ROOT_MISMATCH = "tupleRootMismatch"
    TOTALS_MISMATCH = "totalsMismatch"
    WATERMARK_MISMATCH = "watermarkMismatch"

    @property
    def is_per_shard(self) -> bool:
        """Counted once per failing shard (else once per release-wide finding)."""
        return self in _PER_SHARD

    @property
    def asset_check_name(self) -> str:
        """The name of the blocking Dagster asset check that watches this count."""
        return f"zero_{self.value}"


_PER_SHARD = frozenset(
    {
        Check.OBJECT_UNAVAILABLE,
        Check.KEY_UNAVAILABLE,
        Check.SIZE_MISMATCH,
        Check.STORAGE_DIGEST_MISMATCH,
        Check.DECRYPT_FAILURES,
        Check.FOOTER_UNREADABLE,
        Check.RECORD_SCHEMA_MISMATCH,
        Check.DECODE_FAILURES,
        Check.LOGICAL_DIGEST_MISMATCH,
        Check.RECORD_COUNT_MISMATCH,
        Check.TOKEN_COUNT_MISMATCH,
        Check.MEMBER_SET_DIGEST_MISMATCH,
    }
)
#: Per-shard checks; each counts the shards that failed it.
SHARD_CHECKS: tuple[Check, ...] = tuple(c for c in Check if c.is_per_shard)
#: Release-wide checks; every count must be zero for VERIFIED.
RELEASE_CHECKS: tuple[Check, ...] = tuple(c for c in Check if not c.is_per_shard)
#: Every check, in report order.
ZERO_CHECKS: tuple[Check, ...] = SHARD_CHECKS + RELEASE_CHECKS

#: Counts that say "could not look", never "looked and it was wrong" (check -> the name
#: the attempt records).
UNAVAILABLE_CHECKS: dict[Check, str] = {
    Check.OBJECT_UNAVAILABLE: "object-unavailable",
    Check.KEY_UNAVAILABLE: "key-unavailable",
}
#: Release-wide counts that follow from a shard that could not be read (its members are
#: "missing", the root and totals cannot be recomputed): inconclusive while any shard is
#: unavailable.  Extra, duplicate, substituted or split-conflicting members seen in the
#: shards that were read remain proof.
INCONCLUSIVE_WHEN_PARTIAL: frozenset[Check] = frozenset(
    {Check.MISSING_MEMBERS, Check.TUPLE_ROOT_MISMATCH, Check.TOTALS_MISMATCH}
)


class Outcome(StrEnum):
    """Of one verification attempt.  UNAVAILABLE is not a verdict: an object could not be
    read or no key could open it, so nothing was proven and the release keeps its state
    (STAGED stays STAGED) with the failed attempt recorded.  INVALID is final."""

    VERIFIED = "VERIFIED"
    INVALID = "INVALID"
    UNAVAILABLE = "UNAVAILABLE"


OUTCOMES = tuple(o.value for o in Outcome)
#: Count-name prefixes of findings that no :class:`Check` names: an object that could not
#: be read at all, and a fatal refusal (bad signature, malformed root).
UNAVAILABLE_PREFIX = "unavailable:"
FATAL_PREFIX = "fatal:"


def outcome_of(counts: Mapping[str, int]) -> tuple[Outcome, list[str]]:
    """``(outcome, unavailable checks)`` from one attempt's counts (rule written once).

    Proof wins over unavailability; unavailability makes the partial set checks
    inconclusive instead of proof.
    """
    unavailable = sorted(
        {name for check, name in UNAVAILABLE_CHECKS.items() if counts.get(check)}
        | {
            k.removeprefix(UNAVAILABLE_PREFIX)
            for k, v in counts.items()
            if v and k.startswith(UNAVAILABLE_PREFIX)
        }
    )
    ignore: set[str] = set(UNAVAILABLE_CHECKS) | (
        set(INCONCLUSIVE_WHEN_PARTIAL) if unavailable else set()
    )
    proven = any(
        v for k, v in counts.items() if k not in ignore and not k.startswith(UNAVAILABLE_PREFIX)
    )
    if proven:
        return Outcome.INVALID, unavailable
    if unavailable:
        return Outcome.UNAVAILABLE, unavailable
    return Outcome.VERIFIED, []
