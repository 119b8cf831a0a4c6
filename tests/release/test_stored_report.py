"""A root's stored verification report, as the version pages read it: opened from the
store with its signature checked, and refused when the catalog row points a root at a
report signed for another root (a hostile or corrupted ``reports`` row)."""

import pytest
from support.releases import write

from relgate.catalog.db import execute
from relgate.errors import RejectedError
from relgate.release.verify.report import stored_report
from relgate.release.verify.verifier import verify_release


def test_the_stored_report_is_the_signed_one(ws, snapshot):
    root = write(ws, snapshot.digest).digest
    assert stored_report(ws, root) is None  # not verified yet
    verified = verify_release(ws, root, workers=0, actor="test")
    stored = stored_report(ws, root)
    assert stored is not None
    assert (stored.root, stored.report_digest, stored.outcome) == (
        root,
        verified.report_digest,
        verified.outcome,
    )
    assert stored.counts == verified.counts and stored.state == "VERIFIED"


def test_a_row_pointing_at_another_roots_report_is_refused(ws, snapshot):
    first = write(ws, snapshot.digest, records_per_shard=40).digest
    second = write(ws, snapshot.digest, records_per_shard=70).digest
    signed_for_first = verify_release(ws, first, workers=0, actor="test").report_digest
    verify_release(ws, second, workers=0, actor="test")
    with ws.db.tx() as conn:
        execute(
            conn,
            "UPDATE reports SET report_digest = :r, report_version = "
            "(SELECT report_version FROM reports WHERE subject_digest = :f LIMIT 1) "
            "WHERE subject_digest = :s",
            {"r": signed_for_first, "f": first, "s": second},
        )
    with pytest.raises(RejectedError) as refused:
        stored_report(ws, second)
    assert (refused.value.check, refused.value.digest) == ("report-subject", signed_for_first)
