"""The object-key layout is the one spelling: every owner's key agrees with it."""

import pytest

from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.objects import layout
from relgate.objects.cas import ContentRef, digest_of_uri, key_for
from relgate.release import writer
from relgate.runs import shard_fetch

DIGEST = "sha256:" + "ab" * 32


def test_envelope_keys_match_the_manifest_modules():
    assert layout.snapshot_envelope_key(DIGEST) == sm.envelope_key(DIGEST)
    assert layout.release_envelope_key(DIGEST) == rm.envelope_key(DIGEST)
    assert layout.envelope_key("snapshot", DIGEST) == f"manifests/snapshots/{'ab' * 32}.dsse.json"


@pytest.mark.parametrize("kind", ["snapshot", "release"])
def test_envelope_subject_inverts_envelope_key(kind):
    assert layout.envelope_subject(layout.envelope_key(kind, DIGEST)) == (kind, DIGEST)
    assert layout.envelope_subject(layout.cas_key(DIGEST)) is None
    assert layout.envelope_subject(f"manifests/{kind}s/{'ab' * 32}.json") is None


@pytest.mark.parametrize("encrypted", [False, True])
def test_shard_keys_match_writer_and_verifier(encrypted):
    media = rm.ENCRYPTED_SHARD_MEDIA_TYPE if encrypted else rm.SHARD_MEDIA_TYPE
    key = layout.shard_key(DIGEST, encrypted=encrypted)
    assert key == writer.shard_key(DIGEST, encrypted=encrypted)
    assert key == shard_fetch.object_key({"digest": DIGEST, "mediaType": media})
    assert layout.digest_named_by(key) == DIGEST


def test_cas_keys_and_uris():
    ref = ContentRef(DIGEST, "v1", 3)
    assert ref.key == key_for(DIGEST) == layout.cas_key(DIGEST) == f"cas/sha256/{'ab' * 32}"
    assert ref.uri == layout.cas_uri(DIGEST) == f"cas://sha256/{'ab' * 32}"
    assert digest_of_uri(ref.uri) == DIGEST
    assert layout.canonical_key(ref.uri) == ref.key
    assert layout.digest_named_by(ref.key) == DIGEST
    assert layout.digest_named_by(layout.snapshot_envelope_key(DIGEST)) is None


def test_every_managed_prefix_is_spelled_once():
    keys = [
        layout.snapshot_envelope_key(DIGEST),
        layout.release_envelope_key(DIGEST),
        layout.cas_key(DIGEST),
        layout.shard_key(DIGEST),
    ]
    assert all(k.startswith(layout.MANAGED_PREFIXES) for k in keys)
