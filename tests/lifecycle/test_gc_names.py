"""Names are roots of the sweep (issue 28, item 4): a registered transform wheel or
tokenizer, a tag and the workspace config's transform and tokenizer keep their content,
and registering content whose stored version was deleted restores it."""

import pytest
from support import transforms as art
from support.cli import relgate_cli as cli
from support.workspaces import make_workspace

from relgate.errors import ConflictError, NotFoundError, RejectedError
from relgate.lifecycle.collector import plan_gc, sweep
from relgate.objects.layout import cas_key
from relgate.snapshot import tokenizer
from relgate.snapshot.transform_tags import resolve_transform, tag_transform
from relgate.transforms import refusals
from relgate.transforms.registry import pin_of, register_image, register_wheel


def test_a_fresh_demo_loses_nothing_to_a_sweep(tmp_path):
    """The repro: a fresh demo listed the identity wheel as a candidate, the sweep deleted
    it, `transform show` exited 3 and the next `demo seed --corpus tokens` exited 4."""
    home = tmp_path / "home"
    cli(home, "init")
    seeded = cli(home, "demo", "seed", "--corpus", "tokens")
    identity = seeded["transformTags"]["registry.local/identity:v1"]
    wheel = cas_key(identity)
    plan = cli(home, "gc", "plan", "--grace", "0s")
    assert wheel not in {c["key"] for c in plan["candidates"]}
    named = {n["key"]: n["heldBy"] for n in plan["named"]}
    assert "transform tag registry.local/identity:v1" in named[wheel]
    assert "workspace config transform registry.local/identity:v1" in named[wheel]
    swept = cli(home, "gc", "sweep", "--grace", "0s", "--yes")
    assert wheel not in {d["key"] for d in swept["deleted"]}
    assert cli(home, "transform", "show", "registry.local/identity:v1")["digest"] == identity
    cli(home, "demo", "seed", "--corpus", "tokens")


@pytest.fixture
def blank(tmp_path):
    ws = make_workspace(tmp_path / "home", seed=False)
    yield ws
    ws.close()


def test_registered_tokenizer_and_wheel_survive_a_sweep(blank, tmp_path):
    ws = blank
    spec = register_wheel(ws.db, ws.cas, art.write_wheel(tmp_path, "t-keep", "1.0", art.IDENTITY))
    unused = tokenizer.register(ws, tokenizer.train(["a b c", "b c d"] * 20, vocab_size=300))
    configured = f"registry.local/keep@{spec.pin}"  # a digest reference, not a tag
    ws.config["snapshot"]["transform"] = configured
    plan = plan_gc(ws, grace_seconds=0)
    held = {n.key: n.held_by for n in plan.report().named}
    assert held[cas_key(spec.pin)] == [
        f"registered transform {spec.pin}",
        f"workspace config transform {configured}",
    ]
    assert held[cas_key(unused)] == ["registered tokenizer"]
    result = sweep(ws, actor="gc", grace_seconds=0, plan=plan)
    assert not {d.key for d in result.deleted} & {cas_key(spec.pin), cas_key(unused)}
    assert ws.store.head(cas_key(unused)).version_id
    assert resolve_transform(ws.db, f"registry.local/keep@{spec.pin}", ws.cas).spec == spec


def test_a_tag_made_after_the_plan_is_honoured_by_the_sweep(blank, tmp_path):
    """A name that commits between plan and sweep is re-read inside the gate."""
    ws = blank
    data = tokenizer.train(["x y z"] * 30, vocab_size=300)
    ref = ws.cas.put(data)  # stored, named by nothing yet
    plan = plan_gc(ws, grace_seconds=0)
    assert cas_key(ref.digest) in {c.key for c in plan.candidates}
    assert tokenizer.register(ws, data) == ref.digest
    result = sweep(ws, actor="gc", grace_seconds=0, plan=plan)
    assert result.skipped.get("named") == 1 and not result.deleted
    assert ws.cas.get(ref.digest, ref.version_id) == data


def test_reregistering_a_collected_wheel_restores_it(blank, tmp_path):
    """Before names were roots a sweep deleted registered wheels, and registering the same
    wheel again exited 4 (`transform-pin`): the workspace could not recover."""
    ws = blank
    path = art.write_wheel(tmp_path, "t-gone", "1.0", art.IDENTITY)
    spec = register_wheel(ws.db, ws.cas, path)
    tag_transform(ws.db, "registry.local/gone:v1", spec.pin)
    ws.store.delete_version(cas_key(spec.pin), spec.wheel.object_version)  # what GC did
    with pytest.raises(NotFoundError):
        resolve_transform(ws.db, "registry.local/gone:v1", ws.cas)
    restored = register_wheel(ws.db, ws.cas, path)
    assert restored.wheel.object_version != spec.wheel.object_version
    assert pin_of(ws.db, spec.pin) == restored
    assert resolve_transform(ws.db, "registry.local/gone:v1", ws.cas).spec == restored
    # Another entry point for the same bytes is still a conflict, restored or not.
    with pytest.raises(ConflictError) as err:
        register_wheel(ws.db, ws.cas, path, entry_point="t_gone:other")
    assert err.value.check == refusals.PIN and err.value.digest == spec.pin


def test_a_collected_wheel_is_not_restored_under_another_entry_point(blank, tmp_path):
    """A missing blob lets only the same content (name, version, entry point) re-point."""
    ws = blank
    path = art.write_wheel(tmp_path, "t-other", "1.0", art.IDENTITY)
    spec = register_wheel(ws.db, ws.cas, path)
    ws.store.delete_version(cas_key(spec.pin), spec.wheel.object_version)
    with pytest.raises(ConflictError) as err:
        register_wheel(ws.db, ws.cas, path, entry_point="t_other:other")
    assert err.value.check == refusals.PIN
    assert pin_of(ws.db, spec.pin) == spec


def test_reregistering_a_collected_image_restores_it(blank, tmp_path):
    ws = blank
    art.image_layout(tmp_path / "layout", art.IDENTITY)
    spec = register_image(ws.db, ws.cas, tmp_path / "layout")
    ws.store.delete_version(cas_key(spec.config.sha256), spec.config.object_version)
    restored = register_image(ws.db, ws.cas, tmp_path / "layout")
    assert restored.config.object_version != spec.config.object_version
    assert pin_of(ws.db, spec.pin) == restored
    named = {n.key for n in plan_gc(ws, grace_seconds=0).report().named}
    blobs = (restored.manifest, restored.config, *restored.layers)
    assert {cas_key(b.sha256) for b in blobs} <= named


def test_a_malformed_pin_row_fails_the_plan_closed(blank, tmp_path):
    """The catalog row edited by hand: the plan names it and deletes nothing (exit 3)."""
    ws = blank
    spec = register_wheel(ws.db, ws.cas, art.write_wheel(tmp_path, "t-bad", "1.0", art.IDENTITY))
    with ws.db.tx() as conn:
        conn.exec_driver_sql('UPDATE transform_pins SET spec = \'{"kind": "python-wheel"}\'')
    with pytest.raises(RejectedError) as err:
        plan_gc(ws, grace_seconds=0)
    assert (err.value.check, err.value.digest) == ("named-root", spec.pin)
    assert err.value.exit_code == 3


def test_the_same_content_with_its_blob_present_is_not_repinned(blank, tmp_path):
    """Only a missing stored version lets a registration re-point a pin."""
    ws = blank
    path = art.write_wheel(tmp_path, "t-here", "1.0", art.IDENTITY)
    spec = register_wheel(ws.db, ws.cas, path)
    second = ws.store.put(cas_key(spec.pin), path.read_bytes())  # a newer stored version
    assert second.version_id != spec.wheel.object_version
    with pytest.raises(ConflictError) as err:  # the pinned version is still stored
        register_wheel(ws.db, ws.cas, path)
    assert err.value.check == refusals.PIN
    assert pin_of(ws.db, spec.pin) == spec
