"""The gate's memo of verified envelopes: a hit saves only work, never a check.

Opening a stored envelope is a pure function of its bytes and the trusted keys, so the gate
remembers what it opened, keyed by the key set and the SHA-256 of the exact bytes.  These
tests hold the memo to that: the same bytes under the same keys are opened once; another
key set (even one that reuses a collected set's ``id``) opens them again and refuses what it
does not trust; the memo stays within its bound.
"""

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from relgate.catalog.audit import newest_reports
from relgate.catalog.versions import read_version
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.documents.kind import DocumentKind
from relgate.errors import IntegrityError
from relgate.gate import envelopes
from relgate.gate.approvals import approval_kind
from relgate.gate.envelopes import StoredEnvelopes
from relgate.integrity.signing import TrustedKeys


@pytest.fixture
def opened(monkeypatch):
    """Counts of full openings (signature and model), by kind, from an empty memo."""
    monkeypatch.setattr(envelopes, "_VERIFIED", {})
    counts = {"snapshot": 0, "release": 0, "approval": 0}
    snapshot_open, release_open = DocumentKind.open, rm.open_document
    approval_open = envelopes.open_approval

    def count_snapshot(self, *a, **kw):
        counts["snapshot"] += self is sm.KIND
        return snapshot_open(self, *a, **kw)

    def count_release(*a, **kw):
        counts["release"] += 1
        return release_open(*a, **kw)

    def count_approval(*a, **kw):
        counts["approval"] += 1
        return approval_open(*a, **kw)

    monkeypatch.setattr(DocumentKind, "open", count_snapshot)
    monkeypatch.setattr(rm, "open_document", count_release)
    monkeypatch.setattr(envelopes, "open_approval", count_approval)
    return counts


def _stranger() -> TrustedKeys:
    return TrustedKeys.of(Ed25519PrivateKey.generate().public_key())


def _row(g, kind, digest):
    with g.ws.db.tx() as conn:
        return read_version(conn, kind, digest)


def test_the_same_bytes_under_the_same_keys_are_opened_once(g, opened):
    gate = StoredEnvelopes(g.ws.store, g.ws.trusted_keys)
    for _ in range(3):
        gate.verify("snapshot", _row(g, "snapshot", g.snapshot))
        gate.verify("release", _row(g, "release", g.r1))
    assert opened == {"snapshot": 1, "release": 1, "approval": 0}
    # another key set object opens them again, even with the same keys
    again = StoredEnvelopes(g.ws.store, TrustedKeys(dict(g.ws.trusted_keys.keys)))
    again.verify("release", _row(g, "release", g.r1))
    assert opened["release"] == 2


def test_a_memo_entry_of_another_key_set_is_not_a_verification(g, opened):
    """A collected key set's ``id`` can be reused by a new one: an entry whose key set is
    not this very object is no answer, and keys that do not trust the signer refuse."""
    trusted, stranger = g.ws.trusted_keys, _stranger()
    StoredEnvelopes(g.ws.store, trusted).verify("release", _row(g, "release", g.r1))
    StoredEnvelopes(g.ws.store, trusted).verify("snapshot", _row(g, "snapshot", g.snapshot))
    for memo, entry in list(envelopes._VERIFIED.items()):  # as if stranger reused the id
        envelopes._VERIFIED[(id(stranger), *memo[1:])] = entry
    gate = StoredEnvelopes(g.ws.store, stranger)
    for kind, digest in (("release", g.r1), ("snapshot", g.snapshot)):
        with pytest.raises(IntegrityError) as exc:
            gate.verify(kind, _row(g, kind, digest))
        assert exc.value.check != "envelope-binding"
        assert exc.value.digest == digest
    assert opened["release"] == 2 and opened["snapshot"] == 2


def test_an_approval_entry_of_another_key_set_is_not_a_verification(g, opened):
    trusted, stranger = g.ws.trusted_keys, _stranger()
    with g.ws.db.tx() as conn:
        StoredEnvelopes(g.ws.store, trusted).verify_approval(conn, "release", g.r3)
        StoredEnvelopes(g.ws.store, trusted).verify_approval(conn, "release", g.r3)
        assert opened["approval"] == 1
        for memo, entry in list(envelopes._VERIFIED.items()):
            envelopes._VERIFIED[(id(stranger), *memo[1:])] = entry
        (row,) = newest_reports(conn, [(g.r3, approval_kind("release"))])
        with pytest.raises(IntegrityError) as exc:
            StoredEnvelopes(g.ws.store, stranger).verify_approval(conn, "release", g.r3)
    assert opened["approval"] == 2
    assert exc.value.digest == g.r3
    assert exc.value.object == f"approval {row.report_digest}@{row.report_version}"


def test_the_memo_keeps_at_most_its_bound(g, opened, monkeypatch):
    monkeypatch.setattr(envelopes, "_VERIFIED_MAX", 2)
    gate = StoredEnvelopes(g.ws.store, g.ws.trusted_keys)
    for kind, digest in (("snapshot", g.snapshot), ("release", g.r1), ("release", g.r2)):
        gate.verify(kind, _row(g, kind, digest))
        assert 1 <= len(envelopes._VERIFIED) <= 2
    gate.verify("release", _row(g, "release", g.r2))  # still remembered after the clear
    assert opened["release"] == 2


@pytest.mark.parametrize("fault", ["rot", "missing"])
def test_a_rotted_or_missing_approval_is_refused_with_its_object_and_check(g, opened, fault):
    """The approval's bytes are hashed on every read, remembered or not: rotted after it was
    opened once, or gone, it refuses (exit 3, naming the approval), never an internal error."""
    from support.releases import overwrite_in_place

    from relgate.objects.cas import STORAGE_DIGEST, key_for

    with g.ws.db.tx() as conn:
        StoredEnvelopes(g.ws.store, g.ws.trusted_keys).verify_approval(conn, "release", g.r3)
        (row,) = newest_reports(conn, [(g.r3, approval_kind("release"))])
    path = g.ws.store.local_path(key_for(row.report_digest), row.report_version)
    if fault == "rot":
        overwrite_in_place(path, path.read_bytes().replace(b"=", b"A", 1))
    else:
        path.unlink()
    with g.ws.db.tx() as conn, pytest.raises(IntegrityError) as exc:
        StoredEnvelopes(g.ws.store, g.ws.trusted_keys).verify_approval(conn, "release", g.r3)
    assert exc.value.exit_code == 3
    assert exc.value.object == f"approval {row.report_digest}@{row.report_version}"
    assert exc.value.digest == g.r3
    assert exc.value.check == (STORAGE_DIGEST if fault == "rot" else "exists")
    assert exc.value.message.startswith("signed approval refused: ")
    assert opened["approval"] == 1
