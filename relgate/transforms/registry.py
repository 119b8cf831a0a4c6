"""Registering a transform artifact: store its bytes content-addressed, record its pin.

``register_wheel`` reads a wheel file as hostile input (:mod:`relgate.transforms.wheel`),
stores its bytes in the workspace CAS and records a :class:`WheelTransform` under the
wheel's SHA-256; ``register_image`` does the same for an OCI image layout (every blob
stored by its own digest, the pin is the image manifest digest).  A digest's pin is
written once: registering the same bytes again is idempotent, registering them with a
different entry point is refused, and registering the same bytes after garbage
collection deleted their stored version restores the pin.  ``verify_stored`` re-reads every stored blob of a pin
and refuses bytes that no longer hash to it.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from relgate.catalog.db import Database, execute, one, utcnow
from relgate.documents.transform_spec import (
    SPEC_ADAPTER,
    WHEEL_MEDIA_TYPE,
    BuiltinTransform,
    ImageTransform,
    StoredBlob,
    WheelTransform,
)
from relgate.errors import ConflictError, NotFoundError, RejectedError
from relgate.integrity.canonical import canonical_bytes
from relgate.objects.cas import ContentStore
from relgate.transforms import refusals
from relgate.transforms.image import fetch_blob, read_layout, store_image, trial_unpack
from relgate.transforms.wheel import MAX_WHEEL_BYTES, read_wheel

Pin = WheelTransform | ImageTransform | BuiltinTransform


def _read_file(path: Path) -> bytes:
    if path.is_symlink() or not path.is_file():
        raise RejectedError("not a regular file", object=str(path), check=refusals.PACKAGE)
    with path.open("rb") as handle:
        data = handle.read(MAX_WHEEL_BYTES + 1)
    if len(data) > MAX_WHEEL_BYTES:
        raise RejectedError("wheel is too large", object=str(path), check=refusals.PACKAGE)
    return data


def register_wheel(
    db: Database, cas: ContentStore, path: Path, entry_point: str | None = None
) -> WheelTransform:
    """Check, store and pin a wheel file."""
    data = _read_file(path)
    facts = read_wheel(data, path.name, entry_point)
    ref = cas.put(data)
    spec = WheelTransform(
        distribution=facts.distribution,
        version=facts.version,
        filename=path.name,
        entry_point=facts.entry_point,
        wheel=StoredBlob(
            uri=ref.uri, object_version=ref.version_id, size=ref.size, media_type=WHEEL_MEDIA_TYPE
        ),
    )
    record_pin(db, spec, cas)
    return spec


def register_image(
    db: Database, cas: ContentStore, layout: Path, ref_name: str | None = None
) -> ImageTransform:
    """Check, store and pin the image of an OCI image layout directory."""
    image = read_layout(layout, ref_name)
    with tempfile.TemporaryDirectory(prefix="relgate-image-check-") as root:
        trial_unpack(image, Path(root))
    spec = store_image(cas, image)
    record_pin(db, spec, cas)
    return spec


def _blobs(spec: Pin) -> tuple[StoredBlob, ...]:
    if isinstance(spec, WheelTransform):
        return (spec.wheel,)
    if isinstance(spec, ImageTransform):
        return (spec.manifest, spec.config, *spec.layers)
    return ()


def _unversioned(node: object) -> object:
    """A pin's JSON without its blobs' object versions (the content it names)."""
    if isinstance(node, dict):
        return {k: _unversioned(v) for k, v in node.items() if k != "objectVersion"}
    if isinstance(node, list):
        return [_unversioned(v) for v in node]
    return node


def _restorable(cas: ContentStore | None, stored: Pin, spec: Pin) -> bool:
    """The stored pin names the same content, and a blob it names is no longer stored
    (collected): the new registration's stored versions restore it."""
    if cas is None or _unversioned(stored.to_json()) != _unversioned(spec.to_json()):
        return False
    for blob in _blobs(stored):
        try:
            cas.head(blob.sha256, blob.object_version)
        except NotFoundError:
            return True
    return False


def record_pin(db: Database, spec: Pin, cas: ContentStore | None = None) -> None:
    """Write a digest's pin once (the same pin again is a no-op; another is a conflict).

    The one update: a pin whose stored blob version is gone (garbage collected before
    this change made a registered pin a root of the sweep, or deleted by hand) is
    re-pointed at the versions the same content was just stored as, when ``cas`` shows
    the stored one is missing; the content and entry point must be the same.
    """
    body = canonical_bytes(spec.to_json()).decode()
    with db.tx() as conn:
        # First writer wins on both SQLite and PostgreSQL; what is stored is then compared.
        execute(
            conn,
            "INSERT INTO transform_pins (digest, kind, spec, created_at) VALUES (:d, :k, :s, :t)"
            " ON CONFLICT (digest) DO NOTHING",
            {"d": spec.pin, "k": spec.kind, "s": body, "t": utcnow()},
        )
        row = one(conn, "SELECT spec FROM transform_pins WHERE digest = :d", {"d": spec.pin})
    stored = None if row is None else _loads(str(row["spec"]), spec.pin)
    if stored is not None and stored != spec and _restorable(cas, stored, spec):
        with db.tx() as conn:
            execute(
                conn,
                "UPDATE transform_pins SET spec = :s WHERE digest = :d AND spec = :old",
                {"s": body, "d": spec.pin, "old": str(row["spec"]) if row else ""},
            )
            row = one(conn, "SELECT spec FROM transform_pins WHERE digest = :d", {"d": spec.pin})
        stored = None if row is None else _loads(str(row["spec"]), spec.pin)
    if stored is not None and stored != spec:
        raise ConflictError(
            "this digest is already pinned differently (another entry point or version)",
            object=spec.display_name,
            check=refusals.PIN,
            digest=spec.pin,
        )


def _loads(text: str, digest: str) -> Pin:
    try:
        return SPEC_ADAPTER.validate_python(json.loads(text))
    except ValueError:
        raise RejectedError(
            "stored transform pin is malformed",
            object="transform_pins",
            check=refusals.PIN,
            digest=digest,
        ) from None


def pin_of(db: Database, digest: str) -> Pin | None:
    """The pin registered under ``digest`` (None if nothing is)."""
    with db.tx() as conn:
        row = one(conn, "SELECT spec FROM transform_pins WHERE digest = :d", {"d": digest})
    if row is None:
        return None
    spec = _loads(str(row["spec"]), digest)
    if spec.pin != digest:
        raise RejectedError(
            "stored transform pin names another digest",
            object="transform_pins",
            check=refusals.DIGEST,
            digest=digest,
        )
    return spec


def verify_stored(cas: ContentStore, spec: Pin) -> None:
    """Every stored blob of ``spec`` still hashes to its pinned digest (else refused)."""
    if isinstance(spec, WheelTransform):
        fetch_blob(cas, spec.wheel, f"wheel {spec.filename}")
    elif isinstance(spec, ImageTransform):
        for blob in (spec.manifest, spec.config, *spec.layers):
            fetch_blob(cas, blob, f"image {spec.pin} blob {blob.sha256}")
