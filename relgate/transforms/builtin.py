"""Built-in transforms pinned by a digest of their source text (tests only).

This kind (``builtin-source``) is *not* an image or package digest: it names a function of
this relgate and a SHA-256 over its exact source, so it only proves "the code here is the
code that was pinned".  Test workspaces use it because it runs in process; user builds
pin a wheel or an OCI image (:mod:`relgate.documents.transform_spec`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import polars as pl
from relgate_trust.digests import sha256_digest

from relgate.documents.transform_spec import BuiltinTransform
from relgate.errors import RejectedError, UsageError
from relgate.integrity.canonical import canonical_bytes
from relgate.transforms import refusals

#: A transform as selection runs it.
Transform = Callable[[pl.LazyFrame], pl.LazyFrame]


def normalize_v1(frame: pl.LazyFrame) -> pl.LazyFrame:
    """NFC, collapse runs of whitespace, trim; language codes lower-cased."""
    return frame.with_columns(
        pl.col("text").str.normalize("NFC").str.replace_all(r"\s+", " ").str.strip_chars(),
        pl.col("lang").str.to_lowercase().str.strip_chars(),
    )


def identity_v1(frame: pl.LazyFrame) -> pl.LazyFrame:
    return frame


TRANSFORMS: dict[str, Transform] = {
    "normalize": normalize_v1,
    "identity": identity_v1,
}


def _normalized_text(text: pl.Series) -> pl.Series:
    """``normalize_v1``'s text expression, with NFC and the whitespace regex run only on
    the rows where they can change something: an ASCII row (NFC is the identity) with no
    whitespace but single spaces is only trimmed."""
    plain = (
        (text.str.len_bytes() == text.str.len_chars())
        & ~text.str.contains("  ", literal=True)
        & ~text.str.contains(r"[\t\n\x0b\x0c\r]")
    )
    out = text.str.strip_chars()
    slow = (~plain).arg_true()
    if len(slow):
        fixed = text.gather(slow).str.normalize("NFC").str.replace_all(r"\s+", " ")
        out = out.scatter(slow, fixed.str.strip_chars())
    return out


def normalize_v1_fast(frame: pl.LazyFrame) -> pl.LazyFrame:
    """:func:`normalize_v1` byte for byte (property-tested against it), faster."""
    return frame.with_columns(
        pl.col("text").map_batches(_normalized_text, return_dtype=pl.String),
        pl.col("lang").str.to_lowercase().str.strip_chars(),
    )


#: Equivalent faster code for a transform, keyed by the code digest it is equivalent to
#: (an edited transform has another digest and runs as written).
ACCELERATED: dict[str, Transform] = {
    "sha256:723c0e5118293ee077465bb8a35ec9b8ee58bf359c871e89715564e55dda33f6": normalize_v1_fast,
}


def transform_code_digest(name: str) -> str:
    """The digest that stands for a transform's code: its name and exact source text."""
    if name not in TRANSFORMS:
        raise UsageError(f"unknown transform {name!r}", object=name, check=refusals.KNOWN)
    source = inspect.getsource(TRANSFORMS[name])
    return sha256_digest(
        canonical_bytes({"kind": "relgate.transform.v1", "name": name, "source": source})
    )


def builtin_pin(name: str) -> BuiltinTransform:
    """The pin of the built-in transform ``name`` as the code here is."""
    return BuiltinTransform(name=name, code_digest=transform_code_digest(name))


def builtin_for_digest(name: str, digest: str) -> BuiltinTransform | None:
    """The built-in pin ``name@digest`` stands for, if the code here has that digest."""
    if name in TRANSFORMS and transform_code_digest(name) == digest:
        return builtin_pin(name)
    return None


def run_builtin(spec: BuiltinTransform, what: str) -> Transform:
    """The built-in function, refused unless its code digest is the pinned one."""
    actual = transform_code_digest(spec.name)
    if actual != spec.code_digest:
        raise RejectedError(
            "transform code here does not match the pinned digest",
            object=what,
            check=refusals.DIGEST,
            digest=spec.code_digest,
            details={"pinned": spec.code_digest, "actual": actual},
        )
    return ACCELERATED.get(actual, TRANSFORMS[spec.name])
