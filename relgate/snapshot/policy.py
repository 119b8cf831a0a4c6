"""Selection, split and transform policies: pure, deterministic, recorded by digest.

A policy is a small JSON document of integers and strings; its digest goes into the
manifest, and replay re-runs exactly that policy against the pinned source versions.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow as pa

from relgate.errors import RejectedError, UsageError
from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.digests import sha256_digest
from relgate.integrity.hashing import sha256_rows


# -- selection -------------------------------------------------------------------------------
@dataclass(frozen=True)
class SelectionPolicy:
    languages: tuple[str, ...] = ("en", "de", "fr")
    min_chars: int = 16
    max_chars: int = 20_000

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "relgate.selection.v1",
            "languages": sorted(self.languages),
            "minChars": self.min_chars,
            "maxChars": self.max_chars,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SelectionPolicy:
        if data.get("kind") != "relgate.selection.v1":
            raise UsageError(
                "unknown selection policy kind", object="selectionPolicy", check="policy-kind"
            )
        return cls(tuple(data["languages"]), int(data["minChars"]), int(data["maxChars"]))

    @property
    def digest(self) -> str:
        return sha256_digest(canonical_bytes(self.to_json()))

    def expression(self) -> pl.Expr:
        length = pl.col("text").str.len_chars()
        return (
            pl.col("lang").is_in(list(self.languages))
            & (length >= self.min_chars)
            & (length <= self.max_chars)
        )


# -- split -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SplitPolicy:
    """Bucket = first 4 bytes of SHA-256(seed || 0x00 || sampleId) mod 10000; splits own
    consecutive bucket ranges in basis points.  Depends on the id only, so a sample keeps
    its split across snapshots."""

    seed: str = "relgate-split-1"
    buckets: tuple[tuple[str, int], ...] = (("train", 9000), ("validation", 500), ("test", 500))

    def __post_init__(self) -> None:
        if sum(bp for _, bp in self.buckets) != 10_000:
            raise UsageError(
                "split basis points must sum to 10000", object="splitPolicy", check="split-sum"
            )
        names = [n for n, _ in self.buckets]
        if len(set(names)) != len(names):
            raise UsageError(
                "split names must be unique", object="splitPolicy", check="split-names"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "relgate.split.v1",
            "seed": self.seed,
            "buckets": [[name, bp] for name, bp in self.buckets],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SplitPolicy:
        if data.get("kind") != "relgate.split.v1":
            raise UsageError("unknown split policy kind", object="splitPolicy", check="policy-kind")
        return cls(str(data["seed"]), tuple((str(n), int(bp)) for n, bp in data["buckets"]))

    @property
    def digest(self) -> str:
        return sha256_digest(canonical_bytes(self.to_json()))

    def split_of(self, sample_id: str) -> str:
        h = hashlib.sha256(self.seed.encode() + b"\x00" + sample_id.encode()).digest()
        return self._name_for(int.from_bytes(h[:4], "big") % 10_000)

    def _name_for(self, bucket: int) -> str:
        edge = 0
        for name, bp in self.buckets:
            edge += bp
            if bucket < edge:
                return name
        raise AssertionError("unreachable: buckets sum to 10000")

    def assign(self, sample_ids: pa.Array | pa.ChunkedArray) -> pa.Array:
        raw = sha256_rows(sample_ids, prefix=self.seed.encode() + b"\x00")
        import numpy as np

        words = np.frombuffer(raw, dtype=">u4").reshape(-1, 8)[:, 0].astype(np.int64) % 10_000
        edges = np.cumsum([bp for _, bp in self.buckets])
        index = np.searchsorted(edges, words, side="right")
        names = pa.array([n for n, _ in self.buckets], pa.string())
        return names.take(pa.array(index))


# -- transforms ------------------------------------------------------------------------------
def normalize_v1(frame: pl.LazyFrame) -> pl.LazyFrame:
    """NFC, collapse runs of whitespace, trim; language codes lower-cased."""
    return frame.with_columns(
        pl.col("text").str.normalize("NFC").str.replace_all(r"\s+", " ").str.strip_chars(),
        pl.col("lang").str.to_lowercase().str.strip_chars(),
    )


def identity_v1(frame: pl.LazyFrame) -> pl.LazyFrame:
    return frame


TRANSFORMS: dict[str, Callable[[pl.LazyFrame], pl.LazyFrame]] = {
    "normalize": normalize_v1,
    "identity": identity_v1,
}


def transform_code_digest(name: str) -> str:
    """The digest that stands for a transform's code: its name and exact source text."""
    if name not in TRANSFORMS:
        raise UsageError(f"unknown transform {name!r}", object=name, check="transform-known")
    source = inspect.getsource(TRANSFORMS[name])
    return sha256_digest(
        canonical_bytes({"kind": "relgate.transform.v1", "name": name, "source": source})
    )


@dataclass(frozen=True)
class TransformRef:
    """``<repository>/<name>@sha256:...`` as recorded in a manifest."""

    repository: str
    name: str
    digest: str

    def __str__(self) -> str:
        return f"{self.repository}/{self.name}@{self.digest}"

    @classmethod
    def parse(cls, ref: str) -> TransformRef:
        if "@" not in ref or "/" not in ref:
            raise UsageError(
                "transform must be repository/name@sha256:...", object=ref, check="transform-ref"
            )
        path, digest = ref.split("@", 1)
        repository, name = path.rsplit("/", 1)
        return cls(repository, name, digest)

    def resolve(self) -> Callable[[pl.LazyFrame], pl.LazyFrame]:
        """The transform's code, refused unless its code digest is the pinned one."""
        actual = transform_code_digest(self.name)
        if actual != self.digest:
            raise RejectedError(
                "transform code here does not match the pinned image digest",
                object=str(self),
                check="transform-digest",
                digest=self.digest,
                details={"actual": actual},
            )
        return TRANSFORMS[self.name]
