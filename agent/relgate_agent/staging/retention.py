"""N-1 retention with the deployer: versions are retired only after a newer one serves.

The deployer acknowledges that a version serves with ``relgate-agent ack-serving MODEL
VERSION``; the host records it in ``<models-root>/.serving/<model>.json`` (the version and the
one served before it, written atomically). Retention then keeps, per model:

* the serving version (never deleted);
* every version placed after it (a new version waiting for its own acknowledgement);
* ``keep - 1`` older ones, the previously served first, then the most recently placed
  (``keep = 2``: current + N-1);

and deletes the rest (renamed under ``.staging/.trash`` first). With no acknowledgement
recorded nothing is deleted: placing a version never retires the one that serves.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from relgate_trust.errors import ManifestError
from relgate_trust.fstree import lstat_kind, write_file_atomic
from relgate_trust.names import validate_name

from relgate_agent.errors import AgentError
from relgate_agent.staging.storage import CHECK_NOT_PLACED, VersionStore, gc_versions

SERVING_DIR = ".serving"
MAX_RECORD_BYTES = 4096


class RetentionError(AgentError):
    """An acknowledgement was refused (the version is not placed on this host)."""

    def __init__(self, message: str, *, check: str) -> None:
        super().__init__(message)
        self.check = check


@dataclass(frozen=True)
class ServingRecord:
    model: str
    version: str
    previous: str  # the version served before (kept as N-1), "" if none
    acked_at: float

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "version": self.version,
            "previous": self.previous,
            "ackedAt": self.acked_at,
        }


@dataclass(frozen=True)
class AckOutcome:
    record: ServingRecord
    removed: tuple[str, ...]
    kept: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {**self.record.to_json(), "removed": list(self.removed), "kept": list(self.kept)}


def _record_path(root: Path, model: str) -> Path:
    return root / SERVING_DIR / f"{validate_name('model', model)}.json"


def read_serving(root: Path, model: str) -> ServingRecord | None:
    """The model's serving record; None if there is none or it is not one (hostile file)."""
    path = _record_path(root, model)
    if lstat_kind(path) != "other":
        return None
    try:
        with path.open("rb") as fh:
            doc = json.loads(fh.read(MAX_RECORD_BYTES + 1)[:MAX_RECORD_BYTES])
        record = ServingRecord(
            validate_name("model", doc["model"]),
            validate_name("version", doc["version"]),
            validate_name("version", doc["previous"]) if doc.get("previous") else "",
            float(doc["ackedAt"]),
        )
    except (OSError, ValueError, KeyError, TypeError, ManifestError):
        return None
    return record if record.model == model else None


def _placed(root: Path, model: str) -> list[Path]:
    base = root / model
    if lstat_kind(base) != "dir":
        return []  # a symlinked model dir is never walked
    return sorted(
        (v for v in base.iterdir() if lstat_kind(v) == "dir"), key=lambda p: p.lstat().st_mtime
    )


def retire_versions(
    root: Path, model: str, keep: int, also_keep: frozenset[str] = frozenset()
) -> list[str]:
    """Delete what retention no longer keeps (see the module doc) and is not in
    ``also_keep`` (a version just placed); the names removed."""
    record = read_serving(root, model)
    versions = _placed(root, model)
    names = [v.name for v in versions]
    if record is None or record.version not in names:
        return []  # nobody said what serves: keep everything
    at = names.index(record.version)
    older = sorted(names[:at], key=lambda n: (n != record.previous, -names.index(n)))
    protect = {record.version, *names[at + 1 :], *older[: max(keep - 1, 0)], *also_keep}
    return gc_versions(root, model, 1, protect)


def ack_serving(root: Path, model: str, version: str, keep: int) -> AckOutcome:
    """The deployer says ``model/version`` serves: record it, then apply retention."""
    model, version = validate_name("model", model), validate_name("version", version)
    if not VersionStore.is_placed(root, model, version):
        raise RetentionError(
            f"{model}/{version} is not placed under {root} (check {CHECK_NOT_PLACED}); "
            "only a placed version can serve",
            check=CHECK_NOT_PLACED,
        )
    old = read_serving(root, model)
    previous = ""
    if old is not None:
        previous = old.version if old.version != version else old.previous
    record = ServingRecord(model, version, previous, round(time.time(), 3))
    body = json.dumps(record.to_json(), sort_keys=True).encode()
    write_file_atomic(_record_path(root, model), body, 0o644)
    removed = retire_versions(root, model, keep)
    kept = tuple(v.name for v in _placed(root, model))
    return AckOutcome(record, tuple(sorted(removed)), kept)


__all__ = [
    "AckOutcome",
    "RetentionError",
    "ServingRecord",
    "ack_serving",
    "read_serving",
    "retire_versions",
]
