"""Snapshots built with pinned wheels and OCI images: real wheels, real subprocesses."""

import json

import pytest
from click.testing import CliRunner
from support import transforms as art
from support.snapshots import build, build_active, build_validated
from support.workspaces import make_workspace

from relgate.cli.main import main
from relgate.demo.corpus import tag_demo_transforms
from relgate.demo.image_corpus import seed_images
from relgate.demo.normalizer import build_demo_wheel
from relgate.demo.token_corpus import seed_tokens
from relgate.errors import RejectedError
from relgate.lifecycle.collector import plan_gc
from relgate.snapshot.transform_tags import tag_transform
from relgate.transforms import refusals
from relgate.transforms.registry import register_image, register_wheel

TAG = "registry.local/normalize:v1"


def _cli(home, *args):
    result = CliRunner().invoke(main, ["--home", str(home), *args, "--json"])
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return result.exit_code, json.loads(lines[-1])


def _use(ws, spec, tag=TAG):
    tag_transform(ws.db, tag, spec.pin)
    return spec


def test_demo_wheel_built_by_pip_matches_the_builtin_normalize(ws, tmp_path):
    """The demo package's wheel (pip-built) gives the same members as normalize_v1."""
    builtin = build(ws)
    wheel = build_demo_wheel(tmp_path)
    assert build_demo_wheel(tmp_path / "again").read_bytes() == wheel.read_bytes()  # reproducible
    code, out = _cli(ws.home, "transform", "register", str(wheel), "--tag", TAG)
    assert code == 0, out
    assert out["transform"]["kind"] == "python-wheel"
    assert out["transform"]["distribution"] == "relgate-demo-normalize"
    assert out["transform"]["entryPoint"] == "relgate_demo_normalize:transform"
    code, built = _cli(ws.home, "snapshot", "build", "--alias", "wheel")
    assert code == 0, built
    shown = _cli(ws.home, "snapshot", "show", built["snapshot"], "--manifest")[1]
    body = shown["manifest"]
    assert body["transformImage"] == f"registry.local/normalize@{out['digest']}"
    assert body["transform"]["wheel"]["uri"] == "cas://sha256/" + out["digest"].removeprefix(
        "sha256:"
    )
    assert body["transform"]["version"] == "1.0.0"
    assert body["members"]["tupleRoot"] == builtin.manifest.tuple_root
    assert built["state"] == "VALIDATED", built
    assert built["counts"]["transformOutputRows"] == built["counts"]["sourceRows"]


def test_stored_wheel_bytes_that_no_longer_match_the_pin_are_refused(ws, tmp_path):
    spec = _use(
        ws,
        register_wheel(ws.db, ws.cas, art.write_wheel(tmp_path, "t-identity", "1.0", art.IDENTITY)),
    )
    ref = spec.wheel.content_ref
    path = ws.store.local_path(ref.key, ref.version_id)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes() + b"tampered")
    code, out = _cli(ws.home, "snapshot", "build", "--alias", "x")
    assert code == 3
    assert out["check"] == refusals.DIGEST == "transform-digest"
    assert out["digest"] == spec.pin
    assert out["details"]["pinned"] == spec.pin and out["details"]["actual"] != spec.pin


def test_a_tag_moved_to_a_digest_without_stored_bytes_is_refused(ws, tmp_path):
    first = _use(
        ws,
        register_wheel(ws.db, ws.cas, art.write_wheel(tmp_path, "t-identity", "1.0", art.IDENTITY)),
    )
    assert build(ws).manifest.transform == first
    elsewhere = "sha256:" + "ab" * 32
    tag_transform(ws.db, TAG, elsewhere)
    with pytest.raises(RejectedError) as err:
        build(ws)
    assert err.value.check == refusals.DIGEST and err.value.digest == elsewhere
    # Moved to another registered wheel: the build pins that one.
    (tmp_path / "b").mkdir()
    second = _use(
        ws,
        register_wheel(ws.db, ws.cas, art.write_wheel(tmp_path / "b", "t-shout", "2.0", art.SHOUT)),
    )
    result = build_validated(ws)
    assert result.manifest.transform == second
    assert result.manifest.transform_image == f"registry.local/normalize@{second.pin}"


@pytest.mark.parametrize(
    ("body", "check"),
    [
        (art.INVENT, refusals.INVENTED),
        (art.DUPLICATE, refusals.DUPLICATE),
        (art.MORE_ROWS, refusals.ROWS),
        (art.SCHEMA, refusals.SCHEMA),
        (art.CRASH, refusals.EXIT),
    ],
)
def test_a_transform_that_breaks_the_contract_is_refused(ws, tmp_path, body, check):
    spec = _use(ws, register_wheel(ws.db, ws.cas, art.write_wheel(tmp_path, "t-bad", "1.0", body)))
    with pytest.raises(RejectedError) as err:
        build(ws)
    assert err.value.check == check
    assert err.value.digest == spec.pin
    assert err.value.details["build"]["state"] == "REJECTED"


def test_a_transform_that_hangs_is_killed_and_refused(ws, tmp_path):
    spec = _use(
        ws, register_wheel(ws.db, ws.cas, art.write_wheel(tmp_path, "t-hang", "1.0", art.HANG))
    )
    ws.config["transforms"] = {"timeoutSeconds": 2}
    with pytest.raises(RejectedError) as err:
        build(ws)
    assert err.value.check == refusals.TIMEOUT
    assert err.value.digest == spec.pin


def test_an_oci_image_is_pinned_verified_unpacked_and_run(ws, tmp_path):
    digest = art.image_layout(tmp_path / "layout", art.SHOUT)
    code, out = _cli(ws.home, "transform", "register", str(tmp_path / "layout"), "--tag", TAG)
    assert code == 0, out
    assert out["digest"] == digest and out["transform"]["kind"] == "oci-image"
    result = build_validated(ws)
    assert result.manifest.transform_image == f"registry.local/normalize@{digest}"
    assert result.manifest.transform.kind == "oci-image"
    assert result.manifest.member_count > 0


def test_an_oci_layout_with_a_tampered_layer_is_refused(ws, tmp_path):
    art.image_layout(tmp_path / "layout", art.IDENTITY)
    manifest = json.loads(
        next(
            p.read_bytes()
            for p in (tmp_path / "layout/blobs/sha256").iterdir()
            if b'"layers"' in p.read_bytes()
        )
    )
    layer = (
        tmp_path / "layout/blobs/sha256" / manifest["layers"][0]["digest"].removeprefix("sha256:")
    )
    data = bytearray(layer.read_bytes())
    data[len(data) // 2] ^= 0xFF
    layer.write_bytes(bytes(data))
    code, out = _cli(ws.home, "transform", "register", str(tmp_path / "layout"))
    assert code == 3 and out["check"] == refusals.DIGEST
    assert out["digest"] == manifest["layers"][0]["digest"]


def test_a_stored_layer_tampered_after_registration_is_refused(ws, tmp_path):
    art.image_layout(tmp_path / "layout", art.IDENTITY)
    spec = _use(ws, register_image(ws.db, ws.cas, tmp_path / "layout"))
    ref = spec.layers[0].content_ref
    path = ws.store.local_path(ref.key, ref.version_id)
    path.chmod(0o644)
    path.write_bytes(b"not the layer")
    with pytest.raises(RejectedError) as err:
        build(ws)
    assert err.value.check == refusals.DIGEST and err.value.digest == spec.layers[0].sha256


def test_garbage_collection_keeps_the_wheel_an_active_snapshot_pins(ws, tmp_path):
    spec = _use(
        ws,
        register_wheel(ws.db, ws.cas, art.write_wheel(tmp_path, "t-identity", "1.0", art.IDENTITY)),
    )
    build_active(ws)
    ref = spec.wheel.content_ref
    candidates = {(c.key, c.version_id) for c in plan_gc(ws, grace_seconds=0).candidates}
    assert (ref.key, ref.version_id) not in candidates


@pytest.mark.parametrize("corpus", ["tokens", "images"])
def test_token_id_and_binary_corpora_build_through_the_pinned_identity_wheel(tmp_path, corpus):
    """The demo's identity wheel (pip-built) carries list<uint32> and binary records."""
    ws = make_workspace(tmp_path / "home", seed=False)
    try:
        if corpus == "tokens":
            seed_tokens(ws, records=60)
        else:
            seed_images(ws, objects=2, per_object=10)
        tags = tag_demo_transforms(ws)
        result = build_validated(ws)
        assert result.manifest.transform.kind == "python-wheel"
        assert result.manifest.transform.pin == tags["registry.local/identity:v1"]
        assert result.manifest.member_count > 0
        assert result.counts["transformOutputRows"] == result.counts["sourceRows"]
        assert {a.role for a in result.manifest.artifacts} >= {"transform"}
    finally:
        ws.close()


def test_cli_tag_needs_an_explicit_target_and_show_rechecks_the_pin(ws, tmp_path):
    assert _cli(ws.home, "transform", "tag", TAG)[0] == 2
    wheel = art.write_wheel(tmp_path, "t-identity", "1.0", art.IDENTITY)
    spec = register_wheel(ws.db, ws.cas, wheel)
    code, out = _cli(ws.home, "transform", "tag", TAG, "--digest", spec.pin)
    assert (code, out["digest"]) == (0, spec.pin)
    code, shown = _cli(ws.home, "transform", "show", TAG)
    assert code == 0 and shown["transform"]["distribution"] == "t-identity"
    # Registering the same wheel with another entry point is a conflict, not a new pin.
    code, out = _cli(
        ws.home, "transform", "register", str(wheel), "--entry-point", "t_identity:other"
    )
    assert code == 4 and out["check"] == refusals.PIN
