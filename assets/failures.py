"""Refusals as Dagster failures.

A :class:`relgate.errors.RelgateError` is a refusal (exit 2, 3 or 4 at the command line)
that names its check, object and digest.  In Dagster it fails the step as a ``dg.Failure``
carrying those fields as metadata and the check in its description, so the UI shows why,
not a Python stack trace.  Other exceptions (internal errors) propagate unchanged.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar, cast

import dagster as dg

from relgate.errors import RelgateError

P = ParamSpec("P")
R = TypeVar("R")


def failure_of(exc: RelgateError) -> dg.Failure:
    """The step failure a refusal becomes: ``<check>: <message>`` with every field."""
    return dg.Failure(
        description=f"{exc.check or exc.code}: {exc}",
        metadata={k: dg.MetadataValue.text(str(v)) for k, v in exc.to_json().items()},
    )


def refusals_fail(fn: Callable[P, R]) -> Callable[P, R]:
    """Wrap an asset, op or check body so that a refusal fails it as :func:`failure_of`
    (generator bodies too); the signature Dagster reads is the wrapped one's."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def generator(*args: P.args, **kwargs: P.kwargs) -> Iterator[Any]:
            try:
                yield from cast("Iterator[Any]", fn(*args, **kwargs))
            except RelgateError as exc:
                raise failure_of(exc) from exc

        return cast("Callable[P, R]", generator)

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except RelgateError as exc:
            raise failure_of(exc) from exc

    return call
