"""OCI images: read an image layout, verify every blob, store it, unpack it, run it.

An image layout directory (OCI image-layout spec: ``oci-layout``, ``index.json``,
``blobs/sha256/<hex>``) is read as hostile input: the index must name one image manifest
(or the one whose ``org.opencontainers.image.ref.name`` is asked for), and the manifest,
its config and every layer must hash to the digest and have the size their descriptor
gives.  The blobs are stored content-addressed (an OCI digest *is* a content address), so
the pin is the manifest digest and a build fetches each blob back by digest and exact
version and verifies it again before unpacking.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError
from pydantic.alias_generators import to_camel
from relgate_trust.digests import is_digest, sha256_digest

from relgate.documents.transform_spec import ImageTransform, StoredBlob
from relgate.errors import RejectedError
from relgate.objects.cas import ContentStore
from relgate.transforms import refusals
from relgate.transforms.rootfs import MAX_ROOTFS_BYTES, unpack_layer

MANIFEST_MEDIA_TYPE: Final = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE: Final = "application/vnd.oci.image.config.v1+json"
LAYER_TAR: Final = "application/vnd.oci.image.layer.v1.tar"
LAYER_GZIP: Final = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME: Final = "org.opencontainers.image.ref.name"
#: Largest index, manifest or config document read; largest blob.
MAX_DOCUMENT_BYTES: Final = 4 * 1024 * 1024
MAX_BLOB_BYTES: Final = 512 * 1024 * 1024


class _Doc(BaseModel):
    """An OCI JSON document as parsed here: unknown fields ignored, nothing trusted."""

    model_config = ConfigDict(
        frozen=True, extra="ignore", alias_generator=to_camel, populate_by_name=True
    )


_D = TypeVar("_D", bound=_Doc)


class Descriptor(_Doc):
    media_type: StrictStr
    digest: StrictStr
    size: StrictInt
    annotations: dict[StrictStr, StrictStr] = Field(default_factory=dict)


class Index(_Doc):
    schema_version: StrictInt
    manifests: tuple[Descriptor, ...]


class ImageManifest(_Doc):
    schema_version: StrictInt
    config: Descriptor
    layers: tuple[Descriptor, ...]


class RunConfig(_Doc):
    """The ``config`` object of an image config: what to run (PascalCase in the spec)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)
    entrypoint: tuple[StrictStr, ...] | None = Field(default=None, alias="Entrypoint")
    cmd: tuple[StrictStr, ...] | None = Field(default=None, alias="Cmd")
    env: tuple[StrictStr, ...] | None = Field(default=None, alias="Env")
    working_dir: StrictStr | None = Field(default=None, alias="WorkingDir")

    @property
    def argv(self) -> list[str]:
        return [*(self.entrypoint or ()), *(self.cmd or ())]


class ImageConfig(_Doc):
    config: RunConfig = Field(default_factory=RunConfig)


def _malformed(why: str, what: str, **details: object) -> RejectedError:
    return RejectedError(
        f"image refused: {why}", object=what, check=refusals.IMAGE, details=dict(details)
    )


def _parse(model: type[_D], data: bytes, what: str) -> _D:
    if len(data) > MAX_DOCUMENT_BYTES:
        raise _malformed("document too large", what, size=len(data))
    try:
        return model.model_validate(json.loads(data))
    except (ValueError, ValidationError, RecursionError) as exc:
        raise _malformed("document is not what the spec says", what, cause=str(exc)[:200]) from None


def digest_mismatch(what: str, pinned: str, actual: str) -> RejectedError:
    """The one refusal for bytes that do not hash to their pinned digest."""
    return RejectedError(
        "transform bytes do not match the pinned digest",
        object=what,
        check=refusals.DIGEST,
        digest=pinned,
        details={"pinned": pinned, "actual": actual},
    )


def _blob_path(layout: Path, descriptor: Descriptor, what: str) -> Path:
    if not is_digest(descriptor.digest):
        raise _malformed(
            "descriptor digest is not sha256:<hex>", what, digest=descriptor.digest[:80]
        )
    if descriptor.size < 0 or descriptor.size > MAX_BLOB_BYTES:
        raise _malformed("descriptor size out of bounds", what, size=descriptor.size)
    path = layout / "blobs" / "sha256" / descriptor.digest.removeprefix("sha256:")
    if path.is_symlink() or not path.is_file():
        raise _malformed("blob missing (or a link)", what, digest=descriptor.digest)
    return path


def _read_blob(layout: Path, descriptor: Descriptor, what: str) -> bytes:
    path = _blob_path(layout, descriptor, what)
    with path.open("rb") as handle:
        data = handle.read(descriptor.size + 1)
    actual = sha256_digest(data)
    if len(data) != descriptor.size or actual != descriptor.digest:
        raise digest_mismatch(f"{what} blob {descriptor.digest}", descriptor.digest, actual)
    return data


@dataclass(frozen=True)
class LayoutImage:
    """The verified blobs of one image in a layout: manifest, config and layers."""

    manifest: tuple[Descriptor, bytes]
    config: tuple[Descriptor, bytes]
    layers: tuple[tuple[Descriptor, bytes], ...]


def _pick(index: Index, ref_name: str | None, what: str) -> Descriptor:
    images = [m for m in index.manifests if m.media_type == MANIFEST_MEDIA_TYPE]
    if ref_name is not None:
        images = [m for m in images if m.annotations.get(REF_NAME) == ref_name]
    if len(images) != 1:
        raise _malformed(
            "index must name exactly one image manifest (use --ref)", what, found=len(images)
        )
    return images[0]


def read_layout(layout: Path, ref_name: str | None = None) -> LayoutImage:
    """The one image of an OCI image layout directory, every blob verified."""
    what = str(layout)
    marker = layout / "oci-layout"
    if not marker.is_file() or marker.is_symlink():
        raise _malformed("no oci-layout file", what)
    try:
        version = json.loads(marker.read_bytes()[:4096]).get("imageLayoutVersion")
    except (ValueError, AttributeError):
        version = None
    if version != "1.0.0":
        raise _malformed("oci-layout imageLayoutVersion must be 1.0.0", what)
    index_path = layout / "index.json"
    if not index_path.is_file() or index_path.is_symlink():
        raise _malformed("no index.json", what)
    with index_path.open("rb") as handle:
        index = _parse(Index, handle.read(MAX_DOCUMENT_BYTES + 1), f"{what}/index.json")
    chosen = _pick(index, ref_name, what)
    manifest_bytes = _read_blob(layout, chosen, what)
    manifest = _parse(ImageManifest, manifest_bytes, f"{what} manifest {chosen.digest}")
    _check_manifest(manifest, what)
    config = (manifest.config, _read_blob(layout, manifest.config, what))
    _parse(ImageConfig, config[1], f"{what} config")
    layers = tuple((d, _read_blob(layout, d, what)) for d in manifest.layers)
    return LayoutImage((chosen, manifest_bytes), config, layers)


def _check_manifest(manifest: ImageManifest, what: str) -> None:
    if manifest.schema_version != 2 or manifest.config.media_type != CONFIG_MEDIA_TYPE:  # noqa: PLR2004 OCI schemaVersion
        raise _malformed("not an OCI image manifest (schemaVersion 2, OCI config)", what)
    for layer in manifest.layers:
        if layer.media_type not in (LAYER_TAR, LAYER_GZIP):
            raise _malformed(
                "layer media type not supported", what, mediaType=layer.media_type[:100]
            )


def trial_unpack(image: LayoutImage, root: Path) -> None:
    """Unpack the layers once at registration, so an escaping archive is refused early."""
    budget = MAX_ROOTFS_BYTES
    for descriptor, data in image.layers:
        what = f"image {image.manifest[0].digest} layer {descriptor.digest}"
        budget -= unpack_layer(
            data, root, gzip=descriptor.media_type == LAYER_GZIP, what=what, budget=budget
        )


def store_image(cas: ContentStore, image: LayoutImage) -> ImageTransform:
    """Put every blob into the content store; the pin."""

    def put(descriptor: Descriptor, data: bytes) -> StoredBlob:
        ref = cas.put(data)
        return StoredBlob(
            uri=ref.uri,
            object_version=ref.version_id,
            size=ref.size,
            media_type=descriptor.media_type,
        )

    return ImageTransform(
        manifest=put(*image.manifest),
        config=put(*image.config),
        layers=tuple(put(d, data) for d, data in image.layers),
    )


def fetch_blob(cas: ContentStore, blob: StoredBlob, what: str) -> bytes:
    """A stored blob's bytes by exact version, refused unless they hash to the pin."""
    data = cas.store.get(blob.content_ref.key, blob.object_version)
    actual = sha256_digest(data)
    if actual != blob.sha256:
        raise digest_mismatch(what, blob.sha256, actual)
    return data


def unpack_image(cas: ContentStore, spec: ImageTransform, root: Path) -> RunConfig:
    """Fetch and verify the manifest, config and layers; unpack them under ``root``."""
    what = f"image {spec.pin}"
    manifest = _parse(ImageManifest, fetch_blob(cas, spec.manifest, f"{what} manifest"), what)
    _check_manifest(manifest, what)
    named = [manifest.config.digest, *(d.digest for d in manifest.layers)]
    pinned = [spec.config.sha256, *(b.sha256 for b in spec.layers)]
    if named != pinned:
        raise _malformed("manifest and pin name different blobs", what, manifest=named, pin=pinned)
    config = _parse(ImageConfig, fetch_blob(cas, spec.config, f"{what} config"), what)
    budget = MAX_ROOTFS_BYTES
    for layer in spec.layers:
        data = fetch_blob(cas, layer, f"{what} layer {layer.sha256}")
        budget -= unpack_layer(
            data,
            root,
            gzip=layer.media_type == LAYER_GZIP,
            what=f"{what} layer {layer.sha256}",
            budget=budget,
        )
    if not config.config.argv:
        raise _malformed("config names no Entrypoint or Cmd", what)
    return config.config
