"""The ObjectStore contract, run against every store through the ``object_store`` fixture."""

from __future__ import annotations

import io
import multiprocessing
import os
import queue
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from relgate_trust.digests import sha256_digest
from support.stores import race_creates, spec_of

from relgate.errors import IntegrityError, NotFoundError, ObjectExistsError
from relgate.objects.cas import ContentStore, StorageFault, key_for
from relgate.objects.local import LocalObjectStore
from relgate.objects.versioned import ObjectStore


def _versions(store: ObjectStore, key: str) -> list[str]:
    return [v.version_id for v in store.list_versions(key) if v.key == key]


def test_put_adds_versions_and_old_ones_stay_readable(object_store: ObjectStore) -> None:
    v1 = object_store.put("a/k", b"one")
    v2 = object_store.put("a/k", b"two-two")
    assert v1.version_id != v2.version_id
    assert (v1.size, v2.size) == (3, 7)
    assert object_store.get("a/k", v1.version_id) == b"one"
    assert object_store.get("a/k", v2.version_id) == b"two-two"
    assert object_store.head("a/k").version_id == v2.version_id
    assert _versions(object_store, "a/k") == [v1.version_id, v2.version_id]


def test_create_is_conditional(object_store: ObjectStore) -> None:
    first = object_store.create("c", b"first")
    with pytest.raises(ObjectExistsError) as info:
        object_store.create("c", b"second")
    assert info.value.object == "c"
    assert info.value.check == "conditional-create"
    assert info.value.exit_code == 4
    # The losing create left nothing behind.
    assert _versions(object_store, "c") == [first.version_id]
    assert object_store.get("c", first.version_id) == b"first"


def test_create_after_put_is_refused(object_store: ObjectStore) -> None:
    object_store.put("p", b"x")
    with pytest.raises(ObjectExistsError):
        object_store.create("p", b"y")


def test_create_after_delete_succeeds(object_store: ObjectStore) -> None:
    old = object_store.create("d", b"old")
    object_store.delete("d")
    new = object_store.create("d", b"new")
    assert object_store.head("d").version_id == new.version_id
    assert object_store.get("d", old.version_id) == b"old"
    with pytest.raises(ObjectExistsError):
        object_store.create("d", b"again")


def test_list_shows_current_live_versions_only(object_store: ObjectStore) -> None:
    object_store.put("x/1", b"a")
    v12 = object_store.put("x/1", b"bb")
    v2 = object_store.put("x/2", b"ccc")
    object_store.put("x/3", b"gone")
    object_store.delete("x/3")
    object_store.put("y/1", b"elsewhere")

    listed = list(object_store.list("x/"))
    assert [(v.key, v.version_id, v.size) for v in listed] == [
        ("x/1", v12.version_id, 2),
        ("x/2", v2.version_id, 3),
    ]
    assert all(v.is_latest for v in listed)
    assert [v.key for v in object_store.list()] == ["x/1", "x/2", "y/1"]


def test_list_versions_shows_every_data_version(object_store: ObjectStore) -> None:
    v11 = object_store.put("x/1", b"a")
    v12 = object_store.put("x/1", b"bb")
    v3 = object_store.put("x/3", b"gone")
    object_store.delete("x/3")

    versions = list(object_store.list_versions("x/"))
    assert [(v.key, v.version_id, v.size, v.is_latest) for v in versions] == [
        ("x/1", v11.version_id, 1, False),
        ("x/1", v12.version_id, 2, True),
        # Behind a delete marker: still stored, no longer current.
        ("x/3", v3.version_id, 4, False),
    ]


def test_delete_hides_current_but_keeps_old_versions(object_store: ObjectStore) -> None:
    v1 = object_store.put("k", b"payload")
    object_store.delete("k")
    with pytest.raises(NotFoundError):
        object_store.head("k")
    assert list(object_store.list()) == []
    assert object_store.get("k", v1.version_id) == b"payload"
    head = object_store.head("k", v1.version_id)
    assert (head.version_id, head.size, head.is_latest) == (v1.version_id, 7, False)
    object_store.delete("k")  # deleting a deleted key is harmless
    assert object_store.get("k", v1.version_id) == b"payload"


def test_delete_version_is_permanent(object_store: ObjectStore) -> None:
    v1 = object_store.put("k", b"first")
    v2 = object_store.put("k", b"second")
    object_store.delete_version("k", v2.version_id)

    for _ in range(2):  # and it stays gone: no later write resurrects it
        with pytest.raises(NotFoundError) as info:
            object_store.get("k", v2.version_id)
        assert info.value.object == f"k@{v2.version_id}"
        with pytest.raises(NotFoundError):
            object_store.head("k", v2.version_id)
        with pytest.raises(NotFoundError):
            object_store.delete_version("k", v2.version_id)
        assert v2.version_id not in _versions(object_store, "k")
        v_new = object_store.put("k", b"third")
        assert v_new.version_id != v2.version_id

    # The older version is untouched.
    assert object_store.get("k", v1.version_id) == b"first"


def test_delete_version_of_only_version_frees_the_key(object_store: ObjectStore) -> None:
    v1 = object_store.create("solo", b"x")
    object_store.delete_version("solo", v1.version_id)
    assert list(object_store.list()) == []
    assert list(object_store.list_versions()) == []
    v2 = object_store.create("solo", b"y")
    assert object_store.get("solo", v2.version_id) == b"y"


def test_get_range(object_store: ObjectStore) -> None:
    data = bytes(range(256)) * 4
    v = object_store.put("r", data)
    assert object_store.get_range("r", v.version_id, 0, 10) == data[:10]
    assert object_store.get_range("r", v.version_id, 500, 100) == data[500:600]
    assert object_store.get_range("r", v.version_id, 1000, 100) == data[1000:]  # short
    assert object_store.get_range("r", v.version_id, 2000, 10) == b""  # past the end
    assert object_store.get_range("r", v.version_id, 5, 0) == b""
    # The range reads the pinned version, not the current one.
    object_store.put("r", b"newer")
    assert object_store.get_range("r", v.version_id, 256, 3) == data[256:259]
    with pytest.raises(NotFoundError):
        object_store.get_range("absent", v.version_id, 0, 1)


def test_head(object_store: ObjectStore) -> None:
    v1 = object_store.put("h", b"12345")
    v2 = object_store.put("h", b"123")
    current = object_store.head("h")
    assert (current.key, current.version_id, current.size, current.is_latest) == (
        "h",
        v2.version_id,
        3,
        True,
    )
    old = object_store.head("h", v1.version_id)
    assert (old.version_id, old.size, old.is_latest) == (v1.version_id, 5, False)
    with pytest.raises(NotFoundError):
        object_store.head("never-written")


@pytest.mark.parametrize("bogus", ["999999999999", "0", "nonexistent", "null"])
def test_reading_a_nonexistent_version_is_not_found(object_store: ObjectStore, bogus: str) -> None:
    object_store.put("n", b"x")
    for call in (
        lambda: object_store.get("n", bogus),
        lambda: object_store.head("n", bogus),
        lambda: object_store.get_range("n", bogus, 0, 1),
    ):
        with pytest.raises(NotFoundError) as info:
            call()
        assert info.value.object == f"n@{bogus}"
        assert info.value.exit_code == 3
    with pytest.raises(NotFoundError):
        object_store.get("never-written", bogus)


def test_version_id_of_another_key_is_not_found(object_store: ObjectStore) -> None:
    other = object_store.put("other-key", b"x")
    object_store.put("n", b"x")
    if isinstance(object_store, LocalObjectStore):
        pytest.skip("local version ids are per-key sequence numbers, so they coincide")
    with pytest.raises(NotFoundError):
        object_store.get("n", other.version_id)


ODD_KEYS = [
    "with space",
    "per%cent",
    "%2F-looks-escaped",
    "plus+sign",
    "deep/nested/path/key",
    "double//slash",
    "trailing/",
    "ünïcödé/κλειδί/鍵",
    "emoji-🙂",
    "question?hash#amp&eq=",
    "tilde~star*",
]


@pytest.mark.parametrize("key", ODD_KEYS)
def test_odd_keys_round_trip(object_store: ObjectStore, key: str) -> None:
    v = object_store.put(key, key.encode())
    assert object_store.get(key, v.version_id) == key.encode()
    assert [x.key for x in object_store.list()] == [key]
    assert object_store.head(key).version_id == v.version_id


# -- concurrency ---------------------------------------------------------------------------

RACE_KEYS = 50

# Known bug in relgate/objects/local.py (reported, not this suite's file to fix): a
# create that lists the key while another creator has claimed slot N but not yet renamed
# its data in ignores that in-flight claim and claims N+1, so both creates succeed.
# Only that exact outcome is tolerated, and only on the local store; remove this once


def test_concurrent_create_has_exactly_one_winner(object_store: ObjectStore) -> None:
    """Two real processes, each with its own store, race ``create`` key by key."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    keys = [f"race/{i:03d}" for i in range(RACE_KEYS)]
    spec = spec_of(object_store)
    workers = [
        ctx.Process(target=race_creates, args=(spec, name, keys, barrier, results))
        for name in ("A", "B")
    ]
    for proc in workers:
        proc.start()
    try:
        reports = [results.get(timeout=120) for _ in workers]
        for proc in workers:
            proc.join(timeout=30)
    except queue.Empty:
        pytest.fail("a racing process did not report")
    finally:
        for proc in workers:
            if proc.is_alive():
                proc.kill()
                proc.join()

    assert [error for _, _, error in reports] == [None, None]
    wins = {name: won for name, won, _ in reports}
    for key in keys:
        winners = [name for name in wins if key in wins[name]]
        assert len(winners) == 1, f"{key}: winners {winners}"
        (winner,) = winners
        # The loser wrote nothing: one version, the winner's bytes.
        assert _versions(object_store, key) == [wins[winner][key]]
        assert object_store.get(key, wins[winner][key]) == f"{winner}:{key}".encode()


# -- content-addressed layer ---------------------------------------------------------------


def test_content_store_put_is_idempotent(object_store: ObjectStore) -> None:
    cas = ContentStore(object_store)
    first = cas.put(b"same bytes")
    second = cas.put(b"same bytes")
    assert first == second
    assert first.digest == sha256_digest(b"same bytes")
    assert cas.get(first.digest, first.version_id) == b"same bytes"
    assert _versions(object_store, first.key) == [first.version_id]


def test_content_store_repairs_bytes_that_do_not_match_their_address(
    object_store: ObjectStore,
) -> None:
    """A stored version failing its digest is named and repaired by a new version of the
    same content (the fault recorded, the faulty version left), never blocking the put."""
    wanted = b"the real content"
    digest = sha256_digest(wanted)
    # Someone wrote other bytes under the content address with a raw put.
    planted = object_store.put(key_for(digest), b"impostor")

    faults: list[StorageFault] = []
    cas = ContentStore(object_store, on_fault=faults.append)
    with pytest.raises(IntegrityError) as info:
        cas.get(digest, planted.version_id)
    err = info.value
    assert err.object == f"{key_for(digest)}@{planted.version_id}"
    assert (err.check, err.digest, err.exit_code) == ("storage-digest", digest, 3)
    assert err.details == {
        "key": key_for(digest),
        "version": planted.version_id,
        "expected": digest,
        "actual": sha256_digest(b"impostor"),
        "size": len(b"impostor"),
    }
    ref = cas.put(wanted)
    assert ref.version_id != planted.version_id
    assert cas.get(digest, ref.version_id) == wanted
    assert faults == [
        StorageFault(
            key=key_for(digest),
            version=planted.version_id,
            expected=digest,
            actual=sha256_digest(b"impostor"),
            check="storage-digest",
            repaired_version=ref.version_id,
        )
    ]
    assert _versions(object_store, key_for(digest)) == [planted.version_id, ref.version_id]
    assert cas.put(wanted) == ref  # the repaired version is reused from then on
    assert len(faults) == 1


def test_content_store_repairs_a_stored_version_larger_than_its_content(
    object_store: ObjectStore,
) -> None:
    wanted = b"short"
    digest = sha256_digest(wanted)
    planted = object_store.put(key_for(digest), wanted + b"x" * 1000)
    faults: list[StorageFault] = []
    ref = ContentStore(object_store, on_fault=faults.append).put(wanted)
    assert [(f.version, f.check, f.actual) for f in faults] == [
        (planted.version_id, "size-mismatch", f"size:{len(wanted) + 1000}")
    ]
    assert object_store.get(key_for(digest), ref.version_id) == wanted


def test_a_bounded_read_refuses_a_larger_object_before_reading_it(
    object_store: ObjectStore,
) -> None:
    version = object_store.put("big", b"y" * 100)
    assert object_store.get("big", version.version_id, max_size=100) == b"y" * 100
    with pytest.raises(IntegrityError) as info:
        object_store.get("big", version.version_id, max_size=99)
    err = info.value
    assert (err.check, err.object, err.exit_code) == (
        "size-mismatch",
        f"big@{version.version_id}",
        3,
    )
    assert (err.details["expected"], err.details["actual"]) == (99, 100)


# -- property: odd keys on the local store -------------------------------------------------

_KEY_ALPHABET = st.one_of(
    st.sampled_from(list("/ %+~.-_#?&=:*\\'\"")),
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")),
)


def _valid_key(key: str) -> bool:
    # Key syntax of the contract: non-empty, not absolute.
    return bool(key) and not key.startswith("/")


# Up to 120 characters: long non-ASCII keys exceed a directory name once quoted and are
# stored under a hashed name instead.
_KEYS = st.one_of(
    st.sampled_from([".", "..", "./x", "../x"]), st.text(_KEY_ALPHABET, min_size=1, max_size=120)
).filter(_valid_key)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=st.lists(_KEYS, min_size=1, max_size=5, unique=True), data=st.binary(max_size=64))
def test_odd_keys_round_trip_on_local_store(
    tmp_path_factory: pytest.TempPathFactory, keys: list[str], data: bytes
) -> None:
    store = LocalObjectStore(tmp_path_factory.mktemp("prop"), fsync=False)
    written = {key: store.put(key, data + key.encode()) for key in keys}
    for key, version in written.items():
        assert store.get(key, version.version_id) == data + key.encode()
        assert store.head(key).version_id == version.version_id
    assert [(v.key, v.version_id) for v in store.list()] == sorted(
        (key, version.version_id) for key, version in written.items()
    )
    prefix = keys[0][:1]
    assert sorted(v.key for v in store.list(prefix)) == sorted(
        key for key in keys if key.startswith(prefix)
    )


def test_fetch_to_hashes_and_bounds_the_stored_version(object_store: ObjectStore, tmp_path) -> None:
    """Killed mutants: the digest check, the bound, the cleanup of the partial copy."""
    cas = ContentStore(object_store)
    out = tmp_path / "out"
    ref = cas.put(b"membership bytes")
    target = out / "new" / "dir" / "copy"
    cas.fetch_to(ref.digest, ref.version_id, target, size=ref.size)
    cas.fetch_to(ref.digest, ref.version_id, target)  # again, over the existing copy
    assert target.read_bytes() == b"membership bytes"
    with pytest.raises(IntegrityError) as big:
        cas.fetch_to(ref.digest, ref.version_id, out / "small", size=ref.size - 1)
    assert big.value.check == "size-mismatch"
    digest = sha256_digest(b"wanted")
    planted = object_store.put(key_for(digest), b"impostor")
    with pytest.raises(IntegrityError) as bad:
        cas.fetch_to(digest, planted.version_id, out / "bad")
    assert (bad.value.check, bad.value.details["actual"]) == (
        "storage-digest",
        sha256_digest(b"impostor"),
    )
    left = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert left == ["copy"]  # nothing at a refused target, no partial copy left behind


def test_read_into_is_bounded_and_writes_nothing_it_refuses(object_store: ObjectStore) -> None:
    version = object_store.put("k", b"z" * 1000)
    sink = io.BytesIO()
    assert object_store.read_into("k", version.version_id, sink) == 1000
    assert object_store.read_into("k", version.version_id, sink, max_size=1000) == 1000
    assert sink.getvalue() == b"z" * 2000
    refused = io.BytesIO()
    with pytest.raises(IntegrityError) as info:
        object_store.read_into("k", version.version_id, refused, max_size=999)
    assert (info.value.check, info.value.details["actual"]) == ("size-mismatch", 1000)
    assert refused.getvalue() == b""


def test_delete_version_of_a_delete_marker_is_not_found(object_store: ObjectStore) -> None:
    object_store.put("m", b"data")
    object_store.delete("m")
    marker = [v.version_id for v in object_store.list_versions("m")]
    assert len(marker) == 1
    if isinstance(object_store, LocalObjectStore):
        with pytest.raises(NotFoundError):
            object_store.delete_version("m", f"{int(marker[0]) + 1:012d}")  # the marker's seq


@pytest.mark.parametrize("size", [0, 5, 3 * (1 << 20) + 7])
def test_file_writes_store_the_files_bytes_like_put_and_create(
    object_store: ObjectStore, tmp_path: Path, size: int
) -> None:
    source = tmp_path / "src"
    source.write_bytes(os.urandom(size))
    created = object_store.create_file("f", source)
    assert created.size == size
    assert object_store.get("f", created.version_id) == source.read_bytes()
    with pytest.raises(ObjectExistsError):
        object_store.create_file("f", source)
    again = object_store.put_file("f", source)
    assert again.version_id != created.version_id and again.size == size
    assert _versions(object_store, "f") == [created.version_id, again.version_id]


def test_content_store_put_file_is_put_without_holding_the_file(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    """The same reference as :meth:`ContentStore.put` of the bytes, idempotent, and a
    32 MiB file stored with a small fraction of its size in Python memory."""
    import tracemalloc

    data = os.urandom(32 << 20)
    source = tmp_path / "members.parquet"
    source.write_bytes(data)
    cas = ContentStore(object_store)
    tracemalloc.start()
    try:
        ref = cas.put_file(source)
        again = cas.put_file(source)  # exists: verified by a streamed read
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert ref == again == cas.put(data)
    assert (ref.digest, ref.size) == (sha256_digest(data), len(data))
    assert _versions(object_store, ref.key) == [ref.version_id]


def test_content_store_put_file_repairs_a_faulty_stored_version(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    wanted = b"the real content" * 1000
    digest = sha256_digest(wanted)
    planted = object_store.put(key_for(digest), b"impostor")
    source = tmp_path / "src"
    source.write_bytes(wanted)
    faults: list[StorageFault] = []
    ref = ContentStore(object_store, on_fault=faults.append).put_file(source)
    assert ref.version_id != planted.version_id
    assert object_store.get(key_for(digest), ref.version_id) == wanted
    assert [(f.version, f.check, f.actual, f.repaired_version) for f in faults] == [
        (planted.version_id, "storage-digest", sha256_digest(b"impostor"), ref.version_id)
    ]


def test_content_store_put_file_calls_before_store_with_the_key_before_writing(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    """The hook (a publisher lease) sees the content address while nothing is stored under
    it yet, once per put, whether the object is new or exists."""
    source = tmp_path / "src"
    source.write_bytes(b"leased first")
    seen: list[tuple[str, list[str]]] = []

    def before(key: str) -> None:
        seen.append((key, [v.version_id for v in object_store.list_versions(key)]))

    cas = ContentStore(object_store)
    ref = cas.put_file(source, before_store=before)
    assert cas.put_file(source, before_store=before) == ref
    assert seen == [(ref.key, []), (ref.key, [ref.version_id])]


def test_content_store_put_file_refuses_a_file_that_grew_while_it_was_stored(
    object_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer appending to the file between the hash and the copy: the stored size is
    not the hashed one, so the reference is refused (nothing will name that version)."""
    from relgate.objects.cas import CONTENT_CHANGED

    source = tmp_path / "src"
    source.write_bytes(b"hashed bytes")
    real = object_store.create_file

    def racing(key: str, src: Path) -> object:
        with open(src, "ab") as fh:
            fh.write(b" and more")
        return real(key, src)

    monkeypatch.setattr(object_store, "create_file", racing)
    with pytest.raises(IntegrityError) as info:
        ContentStore(object_store).put_file(source)
    assert info.value.check == CONTENT_CHANGED
    assert info.value.details == {"hashed": 12, "stored": 21}
