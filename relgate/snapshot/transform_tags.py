"""Transform tags and references: a mutable name resolved once to a pinned digest.

A build names a transform by tag (``registry.local/normalize:v1``).  The tag is resolved
once, to ``registry.local/normalize@sha256:...``; the digest must be one whose artifact
(a wheel or an OCI image, :mod:`relgate.transforms.registry`) is registered and whose
stored bytes still hash to it, or the built-in code here
(:mod:`relgate.transforms.builtin`, tests only).  The manifest records the display string
(``transformImage``) and the typed pin (``transform``); validation and replay re-run the
transform from that pin alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from relgate_trust.digests import is_digest

from relgate.catalog.db import Database, execute, one, utcnow
from relgate.documents.snapshot_manifest import ArtifactRef, SnapshotManifest
from relgate.documents.transform_spec import ImageTransform, StoredBlob, WheelTransform
from relgate.errors import NotFoundError, RejectedError, UsageError
from relgate.objects.cas import ContentStore
from relgate.transforms import refusals
from relgate.transforms.builtin import builtin_for_digest, transform_code_digest
from relgate.transforms.launcher import DEFAULT_TIMEOUT_S, TransformRunner
from relgate.transforms.pinned import PinnedTransform
from relgate.transforms.registry import Pin, pin_of, verify_stored
from relgate.workspace import Workspace


def transform_timeout(ws: Workspace) -> int:
    """Seconds a transform may run: workspace config ``transforms.timeoutSeconds``."""
    section = ws.config.get("transforms", {})
    value = (
        section.get("timeoutSeconds", DEFAULT_TIMEOUT_S)
        if isinstance(section, dict)
        else DEFAULT_TIMEOUT_S
    )
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UsageError(
            "transforms.timeoutSeconds must be a positive integer", object="config", check="config"
        )
    return value


@dataclass(frozen=True)
class TransformRef:
    """``<repository>/<name>@sha256:...`` (its ``str``, the manifest's ``transformImage``)
    and, once resolved, the typed pin it stands for."""

    repository: str
    name: str
    digest: str
    spec: Pin | None = None

    def __str__(self) -> str:
        return f"{self.repository}/{self.name}@{self.digest}"

    @classmethod
    def parse(cls, ref: str, spec: Pin | None = None) -> TransformRef:
        path, sep, digest = ref.partition("@")
        if not sep or "/" not in path or not is_digest(digest):
            raise UsageError(
                "transform must be repository/name@sha256:...", object=ref, check=refusals.REF
            )
        repository, name = path.rsplit("/", 1)
        return cls(repository=repository, name=name, digest=digest, spec=spec)

    @classmethod
    def of(cls, manifest: SnapshotManifest) -> TransformRef:
        """The reference and pin a manifest records."""
        return cls.parse(manifest.transform_image, manifest.transform)

    def pin(self) -> Pin:
        """The pin, refused unless it is the digest this reference names."""
        spec = self.spec
        if spec is None:
            raise RejectedError(
                "transform digest names no pinned artifact and no built-in code here",
                object=str(self),
                check=refusals.DIGEST,
                digest=self.digest,
            )
        if spec.pin != self.digest:
            raise RejectedError(
                "transform pin and reference name different digests",
                object=str(self),
                check=refusals.DIGEST,
                digest=self.digest,
                details={"pinned": self.digest, "actual": spec.pin},
            )
        return spec

    def resolve(
        self,
        cas: ContentStore | None = None,
        *,
        runner: TransformRunner | None = None,
        timeout_s: int = DEFAULT_TIMEOUT_S,
    ) -> PinnedTransform:
        """The transform ready to run (a ``LazyFrame -> LazyFrame`` callable)."""
        return PinnedTransform(str(self), self.pin(), cas, runner=runner, timeout_s=timeout_s)


#: The manifest ``artifacts`` role of a pinned transform's stored blobs.
ARTIFACT_ROLE = "transform"


def transform_artifacts(spec: Pin) -> tuple[ArtifactRef, ...]:
    """The stored blobs a snapshot built with ``spec`` must hold (garbage collection keeps
    a manifest's ``artifacts``): the wheel, or the image's manifest, config and layers."""
    blobs: tuple[StoredBlob, ...]
    if isinstance(spec, WheelTransform):
        blobs = (spec.wheel,)
    elif isinstance(spec, ImageTransform):
        blobs = (spec.manifest, spec.config, *spec.layers)
    else:
        return ()
    return tuple(
        ArtifactRef(role=ARTIFACT_ROLE, uri=b.uri, object_version=b.object_version, size=b.size)
        for b in blobs
    )


def pinned_transform(ws: Workspace, manifest: SnapshotManifest) -> PinnedTransform:
    """The transform a manifest pins, ready to re-run (validation and replay)."""
    return TransformRef.of(manifest).resolve(ws.cas, timeout_s=transform_timeout(ws))


def tag_transform(db: Database, tag: str, digest: str | None = None) -> str:
    """Point ``repo/name:tag`` at ``digest``.

    Without a digest the tag points at the *built-in* transform ``name`` of this code (the
    test-only kind, :mod:`relgate.transforms.builtin`).
    """
    repo_name, _, _label = _split_tag(tag)
    name = repo_name.rsplit("/", 1)[1]
    target = digest or transform_code_digest(name)
    if not is_digest(target):
        raise UsageError("digest must be sha256:<64 hex>", object=target, check=refusals.REF)
    with db.tx() as conn:
        if one(conn, "SELECT tag FROM transform_tags WHERE tag = :t", {"t": tag}):
            execute(
                conn,
                "UPDATE transform_tags SET digest = :d, updated_at = :now WHERE tag = :t",
                {"d": target, "now": utcnow(), "t": tag},
            )
        else:
            execute(
                conn,
                "INSERT INTO transform_tags (tag, digest, updated_at) VALUES (:t, :d, :now)",
                {"t": tag, "d": target, "now": utcnow()},
            )
    return target


def _split_tag(tag: str) -> tuple[str, str, str]:
    path, sep, label = tag.rpartition(":")
    if not sep or "/" not in path or not label or "@" in tag:
        raise UsageError(
            "transform tag must be repository/name:tag", object=tag, check=refusals.TAG
        )
    return path, sep, label


def resolve_transform(db: Database, spec: str, cas: ContentStore | None = None) -> TransformRef:
    """Resolve a tag (or accept a digest reference) to its pin; check stored bytes."""
    if "@" in spec:
        ref = TransformRef.parse(spec)
    else:
        path, _, _ = _split_tag(spec)
        with db.tx() as conn:
            row = one(conn, "SELECT digest FROM transform_tags WHERE tag = :t", {"t": spec})
        if row is None:
            raise NotFoundError(
                "transform tag is not registered (relgate transform register ARTIFACT --tag TAG;"
                " the demo: relgate demo seed)",
                object=spec,
                check=refusals.TAG,
            )
        repository, name = path.rsplit("/", 1)
        ref = TransformRef(repository=repository, name=name, digest=str(row["digest"]))
    found = pin_of(db, ref.digest) or builtin_for_digest(ref.name, ref.digest)
    ref = TransformRef(ref.repository, ref.name, ref.digest, found)
    pinned = ref.pin()  # refuses a digest with no artifact (or built-in code) behind it
    if cas is not None:
        verify_stored(cas, pinned)  # the stored bytes still hash to the pin
    return TransformRef(ref.repository, ref.name, ref.digest, pinned)
