import base64
import json

import pytest

from relgate.errors import IntegrityError, RejectedError, UsageError
from relgate.integrity.signing import Role, SigningKey, TrustedKeys, sign_envelope, verify_envelope

TYPE = "application/vnd.relgate.dataset-snapshot.v1+json"  # a builder document


@pytest.fixture
def key():
    return SigningKey.generate(Role.BUILDER)


def trusted(*keys: SigningKey) -> TrustedKeys:
    return TrustedKeys.of(*(k.public_key for k in keys), role=Role.BUILDER)


def test_round_trip(key):
    env = sign_envelope(TYPE, b'{"a":1}', key)
    assert verify_envelope(env, trusted(key), payload_type=TYPE, subject="t") == b'{"a":1}'
    assert env["signatures"][0]["keyid"] == key.keyid


def test_unsigned_is_rejected(key):
    env = sign_envelope(TYPE, b"{}", key)
    env["signatures"] = []
    with pytest.raises(RejectedError) as err:
        verify_envelope(env, trusted(key), payload_type=TYPE, subject="t")
    assert err.value.check == "signature-present"


def test_unknown_key_is_rejected(key):
    env = sign_envelope(TYPE, b"{}", key)
    other = SigningKey.generate()
    with pytest.raises(RejectedError) as err:
        verify_envelope(env, trusted(other), payload_type=TYPE, subject="t")
    assert err.value.check == "signature-trusted"


def test_tampered_payload_is_rejected(key):
    env = sign_envelope(TYPE, json.dumps({"count": 1}).encode(), key)
    env["payload"] = base64.b64encode(json.dumps({"count": 2}).encode()).decode()
    with pytest.raises(IntegrityError) as err:
        verify_envelope(env, trusted(key), payload_type=TYPE, subject="t")
    assert err.value.check == "signature-valid"
    assert err.value.digest == key.keyid


def test_payload_type_is_bound(key):
    env = sign_envelope(TYPE, b"{}", key)
    env["payloadType"] = "application/other"
    with pytest.raises(RejectedError):
        verify_envelope(env, trusted(key), payload_type="application/other", subject="t")


def test_empty_trust_set_is_a_usage_error(key):
    env = sign_envelope(TYPE, b"{}", key)
    with pytest.raises(UsageError):
        verify_envelope(env, TrustedKeys(), payload_type=TYPE, subject="t")


def test_keys_load_from_pem_directory(tmp_path, key):
    (tmp_path / "builder-v3-x.pem").write_bytes(key.public_pem())
    loaded = TrustedKeys.load([tmp_path])
    assert key.keyid in loaded
    assert loaded.keys[key.keyid].role is Role.BUILDER and loaded.keys[key.keyid].version == 3
