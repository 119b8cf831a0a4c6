"""The in-toto Statement v1 / SLSA provenance v1 model: its encoding round-trips byte for
byte, a signed statement opens only with the right key and role, and the binding checks
(subjects, materials) refuse any difference."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relgate.errors import IntegrityError, RejectedError
from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.signing import Role, SigningKey, TrustedKeys
from relgate.integrity.statement import (
    BUILDER_CHECK,
    MATERIALS_CHECK,
    SUBJECT_CHECK,
    BuildDefinition,
    Builder,
    BuildMetadata,
    ResourceDescriptor,
    RunDetails,
    SlsaProvenance,
    Statement,
    builder_id,
    open_statement,
    require_materials,
    require_subjects,
    sign_statement,
)

HEX = st.text("0123456789abcdef", min_size=64, max_size=64)
TEXT = st.text(min_size=1, max_size=20)
SAFE = st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
ANNOTATIONS = st.dictionaries(TEXT, st.one_of(TEXT, SAFE), max_size=3)


@st.composite
def descriptors(draw):
    fields = {"digest": {"sha256": draw(HEX)}}
    for name in ("uri", "name", "mediaType"):
        if draw(st.booleans()):
            fields[name] = draw(TEXT)
    if draw(st.booleans()):
        fields["annotations"] = draw(ANNOTATIONS)
    return ResourceDescriptor.model_validate(fields)


def statement_of(subjects, materials, keyid="sha256:" + "a" * 64, params=None):
    return Statement(
        subject=tuple(subjects),
        predicate=SlsaProvenance(
            build_definition=BuildDefinition(
                build_type="https://relgate.dev/test/v1",
                external_parameters=params or {},
                internal_parameters={},
                resolved_dependencies=tuple(materials),
            ),
            run_details=RunDetails(
                builder=Builder(id=builder_id("test-builder", keyid), version={"relgate": "0"}),
                metadata=BuildMetadata(
                    invocation_id="i", started_on="2026-01-01T00:00:00Z", finished_on="x"
                ),
            ),
        ),
    )


@settings(max_examples=150, deadline=None)
@given(
    st.lists(descriptors(), min_size=1, max_size=4),
    st.lists(descriptors(), max_size=6),
    st.dictionaries(TEXT, st.one_of(TEXT, SAFE, st.lists(TEXT, max_size=2)), max_size=3),
)
def test_encoding_round_trips_byte_for_byte(subjects, materials, params):
    statement = statement_of(subjects, materials, params=params)
    data = statement.canonical()
    decoded = json.loads(data)
    assert decoded["_type"] == "https://in-toto.io/Statement/v1"
    assert decoded["predicateType"] == "https://slsa.dev/provenance/v1"
    assert "resolvedDependencies" in decoded["predicate"]["buildDefinition"]
    again = Statement.parse(decoded)
    assert again == statement and again.canonical() == data
    assert canonical_bytes(decoded) == data
    # Absent optional fields stay absent (no nulls on the wire).
    assert not _nulls(decoded)


def _nulls(node) -> bool:
    if isinstance(node, dict):
        return any(v is None or _nulls(v) for v in node.values())
    if isinstance(node, list):
        return any(v is None or _nulls(v) for v in node)
    return False


@settings(max_examples=50, deadline=None)
@given(
    st.lists(descriptors(), min_size=2, max_size=6, unique_by=lambda d: d.canonical()), st.randoms()
)
def test_materials_are_a_multiset(materials, rnd):
    statement = statement_of([materials[0]], materials)
    shuffled = list(materials)
    rnd.shuffle(shuffled)
    require_materials(statement, shuffled, subject="s")
    with pytest.raises(IntegrityError) as err:
        require_materials(statement, shuffled[1:], subject="s")
    assert err.value.check == MATERIALS_CHECK and err.value.digest == shuffled[0].sha256


@pytest.mark.parametrize(
    "bad",
    [
        {"uri": "x"},  # no digest
        {"digest": {}},
        {"digest": {"sha256": "A" * 64}},  # not lowercase hex
        {"digest": {"sha256": "a" * 63}},
        {"digest": {"sha256": "a" * 64, "md5": "00"}},  # only sha256 is recorded
        {"digest": {"sha256": "a" * 64}, "annotations": {"f": 1.5}},  # no floats
    ],
)
def test_a_descriptor_needs_a_sha256_digest(bad):
    with pytest.raises(RejectedError):
        ResourceDescriptor.parse(bad)


def test_signed_statement_opens_only_for_its_key_role_and_builder():
    key = SigningKey.generate(Role.BUILDER)
    trusted = TrustedKeys.of(key.public_key, role=Role.BUILDER)
    subject = ResourceDescriptor.of("sha256:" + "b" * 64, name="thing")
    statement = statement_of([subject], [subject], keyid=key.keyid)
    envelope = json.dumps(sign_statement(statement, key)).encode()
    opened = open_statement(envelope, trusted, role=Role.BUILDER, kind="test-builder", subject="s")
    assert opened == statement
    require_subjects(opened, {"thing": "sha256:" + "b" * 64}, subject="s")
    with pytest.raises(IntegrityError) as err:
        require_subjects(opened, {"thing": "sha256:" + "c" * 64}, subject="s")
    assert err.value.check == SUBJECT_CHECK
    with pytest.raises(RejectedError):  # right key, wrong role
        open_statement(envelope, trusted, role=Role.VERIFIER, kind="test-builder", subject="s")
    with pytest.raises(RejectedError) as err:  # builder id names another kind
        open_statement(envelope, trusted, role=Role.BUILDER, kind="other", subject="s")
    assert err.value.check == BUILDER_CHECK
    lying = statement_of([subject], [subject], keyid="sha256:" + "d" * 64)
    envelope = json.dumps(sign_statement(lying, key)).encode()
    with pytest.raises(RejectedError) as err:  # builder id names another key
        open_statement(envelope, trusted, role=Role.BUILDER, kind="test-builder", subject="s")
    assert err.value.check == BUILDER_CHECK
