"""Hostile archives: wheels and image layers that would escape, lie or overflow."""

import io
import tarfile
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import transforms as art

from relgate.errors import RejectedError, RelgateError
from relgate.transforms import refusals
from relgate.transforms.registry import register_image, register_wheel
from relgate.transforms.rootfs import unpack_layer
from relgate.transforms.wheel import parse_filename, parse_metadata, read_wheel, unpack_wheel


def _link(name, target, kind=tarfile.SYMTYPE):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def _member(name, kind=tarfile.REGTYPE):
    info = tarfile.TarInfo(name)
    info.type = kind
    return info


@pytest.mark.parametrize(
    "extra",
    [
        _link("app/escape", "../../etc/passwd"),
        _link("app/abs", "/etc/passwd"),
        _link("app/hard", "../outside", tarfile.LNKTYPE),
        _member("../evil.py"),
        _member("/abs.py"),
        _member("app/dev", tarfile.CHRTYPE),
        _member("app/fifo", tarfile.FIFOTYPE),
    ],
    ids=["symlink-dotdot", "symlink-abs", "hardlink", "dotdot", "absolute", "device", "fifo"],
)
def test_an_image_layer_that_escapes_is_refused(ws, tmp_path, extra):
    art.image_layout(tmp_path / "layout", art.IDENTITY, extra=[extra])
    with pytest.raises(RejectedError) as err:
        register_image(ws.db, ws.cas, tmp_path / "layout")
    assert err.value.check == refusals.UNPACK
    assert not (tmp_path / "evil.py").exists()


def test_links_inside_the_root_and_whiteouts_are_fine(tmp_path):
    first = art.layer_tar({"app/a.txt": b"a", "app/b.txt": b"b"}, extra=[_link("app/l", "a.txt")])
    second = art.layer_tar({"app/.wh.b.txt": b""})
    unpack_layer(first, tmp_path, gzip=True, what="t", budget=1 << 20)
    unpack_layer(second, tmp_path, gzip=True, what="t", budget=1 << 20)
    assert (tmp_path / "app/l").read_text() == "a"
    assert not (tmp_path / "app/b.txt").exists()


def test_a_layer_over_the_size_bound_is_refused(tmp_path):
    layer = art.layer_tar({"app/big": b"x" * 4096})
    with pytest.raises(RejectedError) as err:
        unpack_layer(layer, tmp_path, gzip=True, what="t", budget=1024)
    assert err.value.check == refusals.UNPACK


def _zip(members):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, body in members.items():
            archive.writestr(name, body)
    return buffer.getvalue()


def test_a_wheel_with_a_path_escape_is_refused(ws, tmp_path):
    data = art.wheel_bytes(
        "t-x", "1.0", {"../evil.py": b"", "t_x/__init__.py": b""}, entry="t_x:transform"
    )
    path = tmp_path / "t_x-1.0-py3-none-any.whl"
    path.write_bytes(data)
    with pytest.raises(RejectedError) as err:
        register_wheel(ws.db, ws.cas, path)
    assert err.value.check == refusals.UNPACK


def test_a_wheel_with_a_symlink_member_is_refused(tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        info = zipfile.ZipInfo("t_x/link")
        info.external_attr = (0o120777) << 16
        archive.writestr(info, "/etc/passwd")
    with pytest.raises(RejectedError) as err:
        unpack_wheel(buffer.getvalue(), tmp_path, "w")
    assert err.value.check == refusals.UNPACK


@pytest.mark.parametrize(
    ("filename", "metadata"),
    [
        ("t_x-2.0-py3-none-any.whl", "Name: t-x\nVersion: 1.0\n"),
        ("other-1.0-py3-none-any.whl", "Name: t-x\nVersion: 1.0\n"),
        ("t_x-1.0-py3-none-any.whl", "Name: t-x\nName: t-y\nVersion: 1.0\n"),
        ("t_x-1.0-py3-none-any.whl", "Version: 1.0\n"),
        ("not-a-wheel.zip", "Name: t-x\nVersion: 1.0\n"),
    ],
    ids=["version", "name", "two-names", "no-name", "filename"],
)
def test_a_wheel_whose_metadata_disagrees_with_its_name_is_refused(filename, metadata):
    data = art.wheel_bytes(
        "t-x", "1.0", {"t_x/__init__.py": b""}, entry="t_x:transform", metadata=metadata
    )
    with pytest.raises(RejectedError) as err:
        read_wheel(data, filename)
    assert err.value.check == refusals.PACKAGE


def test_a_wheel_needs_exactly_one_entry_point_or_an_explicit_one():
    data = art.wheel_bytes("t-x", "1.0", {"t_x/__init__.py": b""})
    with pytest.raises(RejectedError) as err:
        read_wheel(data, "t_x-1.0-py3-none-any.whl")
    assert err.value.check == refusals.PACKAGE
    assert (
        read_wheel(data, "t_x-1.0-py3-none-any.whl", "t_x:transform").entry_point == "t_x:transform"
    )
    with pytest.raises(RejectedError):
        read_wheel(data, "t_x-1.0-py3-none-any.whl", "t_x:transform; import os")


_NAMES = st.from_regex(r"[A-Za-z][A-Za-z0-9]{0,8}([._-][A-Za-z0-9]{1,5}){0,2}", fullmatch=True)
_VERSIONS = st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,3}", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(name=_NAMES, version=_VERSIONS)
def test_name_and_version_round_trip_through_metadata_and_filename(name, version):
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: x\n".encode()
    assert parse_metadata(meta).distribution == name
    spelled = parse_filename(f"{name.replace('-', '_')}-{version}-py3-none-any.whl")
    assert spelled.version == version
    data = art.wheel_bytes(name, version, {"m/__init__.py": b""}, entry="m:transform")
    facts = read_wheel(
        data, f"{name.replace('-', '_').replace('.', '_')}-{version}-py3-none-any.whl"
    )
    assert (facts.distribution, facts.version, facts.entry_point) == (name, version, "m:transform")


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=2048), filename=st.text(max_size=60))
def test_arbitrary_bytes_and_names_are_refused_never_crash(data, filename):
    try:
        read_wheel(data, filename)
    except RelgateError as exc:
        assert exc.exit_code == 3


@settings(max_examples=100, deadline=None)
@given(
    members=st.dictionaries(
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=30),
        st.binary(max_size=64),
        max_size=6,
    ),
    meta=st.binary(max_size=300),
)
def test_arbitrary_zips_are_refused_never_crash(members, meta):
    members = {**members, "t_x-1.0.dist-info/METADATA": meta}
    try:
        read_wheel(_zip(members), "t_x-1.0-py3-none-any.whl")
    except RelgateError as exc:
        assert exc.exit_code == 3
