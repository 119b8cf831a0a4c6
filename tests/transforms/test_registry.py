"""The pin catalog on SQLite and PostgreSQL: written once, compared, resolved through tags."""

import pytest
from support import transforms as art
from support.workspaces import make_workspace

from relgate.errors import ConflictError, RejectedError
from relgate.snapshot.transform_tags import resolve_transform, tag_transform
from relgate.transforms import refusals
from relgate.transforms.registry import pin_of, record_pin, register_wheel


@pytest.fixture
def blank(tmp_path, db_url):
    ws = make_workspace(tmp_path / "home", db_url, seed=False)
    yield ws
    ws.close()


def test_a_pin_is_written_once_and_resolves_through_its_tag(blank, tmp_path):
    ws = blank
    wheel = art.write_wheel(tmp_path, "t-identity", "1.0", art.IDENTITY)
    spec = register_wheel(ws.db, ws.cas, wheel)
    assert register_wheel(ws.db, ws.cas, wheel) == spec  # idempotent
    assert pin_of(ws.db, spec.pin) == spec
    with pytest.raises(ConflictError) as err:
        record_pin(ws.db, spec.model_copy(update={"entry_point": "t_identity:other"}))
    assert err.value.check == refusals.PIN and err.value.digest == spec.pin
    tag_transform(ws.db, "registry.local/clean:v1", spec.pin)
    ref = resolve_transform(ws.db, "registry.local/clean:v1", ws.cas)
    assert (str(ref), ref.spec) == (f"registry.local/clean@{spec.pin}", spec)
    unknown = "sha256:" + "cd" * 32
    with pytest.raises(RejectedError) as refused:
        resolve_transform(ws.db, f"registry.local/clean@{unknown}", ws.cas)
    assert refused.value.check == refusals.DIGEST and refused.value.digest == unknown
