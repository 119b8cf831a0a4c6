"""Names as roots of the sweep: what a name points at is never garbage.

Versions are held by aliases, runs, permits, pins and leases
(:mod:`relgate.holds.retention`).  Content no version references yet is held by the
names that point at it:

* every registered transform pin (``transform_pins``: a wheel, or an OCI image's
  manifest, config and layers), and every transform tag that names one;
* every registered tokenizer (``tokenizers``);
* the workspace config's configured transform (``snapshot.transform``, a tag or a digest
  reference) and the tokenizer its record schema counts with: what the next build uses.

A named key is kept whole (every stored version of it): a name points at content, and the
content's key is its digest.  A name whose content is gone is reported, never a failure:
registering the same bytes again restores it (:func:`relgate.transforms.registry.record_pin`).
"""

from __future__ import annotations

import json
from collections import defaultdict

from relgate_trust.digests import is_digest
from sqlalchemy import Connection

from relgate.catalog.db import rows
from relgate.documents.transform_spec import (
    SPEC_ADAPTER,
    ImageTransform,
    StoredBlob,
    WheelTransform,
)
from relgate.errors import RejectedError
from relgate.integrity.contract import Contract
from relgate.objects.layout import canonical_key, cas_key
from relgate.workspace import Workspace

#: The check a malformed name row fails the plan with (fail closed: never guess).
NAMED_ROOT = "named-root"

#: canonical key -> the names that hold it
Names = dict[str, list[str]]


class NamedObject(Contract):
    """A stored key a name points at, and the names."""

    key: str
    held_by: list[str]


def _blobs(spec_text: str, digest: str) -> tuple[StoredBlob, ...]:
    try:
        spec = SPEC_ADAPTER.validate_python(json.loads(spec_text))
    except ValueError:
        raise RejectedError(
            "a registered transform pin is malformed; garbage collection fails closed",
            object="transform_pins",
            check=NAMED_ROOT,
            digest=digest,
        ) from None
    if isinstance(spec, WheelTransform):
        return (spec.wheel,)
    if isinstance(spec, ImageTransform):
        return (spec.manifest, spec.config, *spec.layers)
    return ()  # built-in code: nothing stored


def _configured(ws: Workspace) -> tuple[str, str | None]:
    """(the configured transform's tag or reference, the record schema's tokenizer)."""
    from relgate.snapshot.build import BuildSpec  # noqa: PLC0415 - heavy, only for a plan

    spec = BuildSpec.from_config(ws.config)  # a malformed section: UsageError, exit 2
    return spec.transform, spec.records.tokens.tokenizer


def name_roots(ws: Workspace, conn: Connection) -> Names:
    """Canonical key -> the names that hold it, read on ``conn`` (the gate orders it)."""
    held: Names = defaultdict(list)
    by_pin: dict[str, list[str]] = {}
    for row in rows(conn, "SELECT digest, spec FROM transform_pins ORDER BY digest"):
        digest = str(row["digest"])
        keys = [canonical_key(b.content_ref.key) for b in _blobs(str(row["spec"]), digest)]
        by_pin[digest] = keys
        for key in keys:
            held[key].append(f"registered transform {digest}")
    tags = {
        str(r["tag"]): str(r["digest"])
        for r in rows(conn, "SELECT tag, digest FROM transform_tags")
    }
    for tag, digest in sorted(tags.items()):
        for key in by_pin.get(digest, ()):
            held[key].append(f"transform tag {tag}")
    for row in rows(conn, "SELECT digest FROM tokenizers ORDER BY digest"):
        held[canonical_key(cas_key(str(row["digest"])))].append("registered tokenizer")
    transform, tokenizer = _configured(ws)
    configured = transform.rpartition("@")[2] if "@" in transform else tags.get(transform)
    for key in by_pin.get(configured or "", ()):
        held[key].append(f"workspace config transform {transform}")
    if tokenizer is not None and is_digest(tokenizer):
        held[canonical_key(cas_key(tokenizer))].append("workspace config tokenizer")
    return dict(held)


def named_objects(names: Names) -> list[NamedObject]:
    return [NamedObject(key=k, held_by=sorted(set(v))) for k, v in sorted(names.items())]


__all__ = [
    "NAMED_ROOT",
    "NamedObject",
    "Names",
    "name_roots",
    "named_objects",
]
