"""The identity of a pinned transform, as the manifest and the pin catalog record it.

A transform is one of three kinds, discriminated by ``kind``:

* ``python-wheel``: a Python entry point pinned by distribution name, version and the
  SHA-256 of the wheel's bytes, stored content-addressed in the workspace;
* ``oci-image``: an OCI image pinned by its manifest digest, with the config and every
  layer blob stored content-addressed by its own digest;
* ``builtin-source``: a function of relgate itself pinned by a digest of its source text.
  For tests only (it runs in process); a user build pins an artifact.

Every stored blob is ``{"uri": "cas://...", "objectVersion": ...}`` so that garbage
collection's generic walk over a manifest finds it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictInt, StrictStr, TypeAdapter

from relgate.integrity.contract import Contract
from relgate.objects.cas import ContentRef, digest_of_uri

WHEEL_KIND: Literal["python-wheel"] = "python-wheel"
IMAGE_KIND: Literal["oci-image"] = "oci-image"
BUILTIN_KIND: Literal["builtin-source"] = "builtin-source"
WHEEL_MEDIA_TYPE = "application/vnd.python.wheel"


class StoredBlob(Contract):
    """One content-addressed object: its address, exact version, size and media type."""

    uri: StrictStr
    object_version: StrictStr
    size: StrictInt
    media_type: StrictStr

    @property
    def sha256(self) -> str:
        """The pinned digest (``sha256:<hex>``) the address spells."""
        return digest_of_uri(self.uri)

    @property
    def content_ref(self) -> ContentRef:
        return ContentRef(self.sha256, self.object_version, self.size)


class WheelTransform(Contract):
    """A Python entry point in a wheel pinned by name, version and wheel digest."""

    kind: Literal["python-wheel"] = WHEEL_KIND
    distribution: StrictStr
    version: StrictStr
    filename: StrictStr
    entry_point: StrictStr
    wheel: StoredBlob

    @property
    def pin(self) -> str:
        return self.wheel.sha256

    @property
    def display_name(self) -> str:
        return f"{self.distribution}=={self.version} {self.entry_point}"


class ImageTransform(Contract):
    """An OCI image pinned by manifest digest; config and layers stored by their digests."""

    kind: Literal["oci-image"] = IMAGE_KIND
    manifest: StoredBlob
    config: StoredBlob
    layers: tuple[StoredBlob, ...]

    @property
    def pin(self) -> str:
        return self.manifest.sha256

    @property
    def display_name(self) -> str:
        return f"oci image {self.pin}"


class BuiltinTransform(Contract):
    """A relgate function pinned by a digest of its source (tests only)."""

    kind: Literal["builtin-source"] = BUILTIN_KIND
    name: StrictStr
    code_digest: StrictStr

    @property
    def pin(self) -> str:
        return self.code_digest

    @property
    def display_name(self) -> str:
        return f"builtin {self.name}"


#: A pinned transform, discriminated by ``kind``.
TransformSpec = Annotated[
    WheelTransform | ImageTransform | BuiltinTransform, Field(discriminator="kind")
]
SPEC_ADAPTER: TypeAdapter[WheelTransform | ImageTransform | BuiltinTransform] = TypeAdapter(
    TransformSpec
)
