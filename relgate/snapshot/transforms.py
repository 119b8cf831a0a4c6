"""Transform image tags: a mutable name that must still resolve to the pinned code digest.

A build names a transform by tag (``registry.local/normalize:v1``).  The tag is resolved
once, to ``registry.local/normalize@sha256:...``, and that digest is what the manifest
records.  If the tag now resolves to a digest other than the code that would run, the
build is refused rather than run code nobody pinned.
"""

from __future__ import annotations

from relgate.catalog.db import Database, execute, one, utcnow
from relgate.errors import NotFoundError, UsageError
from relgate.snapshot.policy import TRANSFORMS, TransformRef, transform_code_digest


def tag_transform(db: Database, tag: str, digest: str | None = None) -> str:
    """Point ``repo/name:tag`` at ``digest`` (default: the code digest of ``name`` here)."""
    repo_name, _, _label = _split_tag(tag)
    name = repo_name.rsplit("/", 1)[1]
    target = digest or transform_code_digest(name)
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
            "transform tag must be repository/name:tag", object=tag, check="transform-tag"
        )
    return path, sep, label


def resolve_transform(db: Database, spec: str) -> TransformRef:
    """Resolve a tag (or accept a digest reference) and check it against the code here."""
    if "@" in spec:
        ref = TransformRef.parse(spec)
    else:
        path, _, _ = _split_tag(spec)
        with db.tx() as conn:
            row = one(conn, "SELECT digest FROM transform_tags WHERE tag = :t", {"t": spec})
        if row is None:
            raise NotFoundError(
                "transform tag is not registered (relgate transform tag)",
                object=spec,
                check="transform-tag",
            )
        repository, name = path.rsplit("/", 1)
        ref = TransformRef(repository=repository, name=name, digest=str(row["digest"]))
    if ref.name not in TRANSFORMS:
        raise UsageError(f"unknown transform {ref.name!r}", object=spec, check="transform-known")
    ref.resolve()  # refuses a digest that is not this code
    return ref
