"""Log context and formats for the daemons: ``--log-format text`` (one human line) or
``json`` (one JSON object per line: ts, level, logger, msg, and job, host, stripe and
topology_version when the code that logs knows them).

What a record knows comes from context variables set where the work is scoped: a job's
threads (:meth:`relgate_agent.agent.job.JobState.spawn`) carry the job, the agent's host id
and the job's current topology version, a stripe worker its stripe; the process's own
fields (the agent's host id) are set once by :func:`setup_logging`. Threads start with an
empty context, so each thread sets its own (:func:`bind`).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import functools
import json
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any, Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

JOB: contextvars.ContextVar[str | None] = contextvars.ContextVar("relgate_job", default=None)
HOST: contextvars.ContextVar[str | None] = contextvars.ContextVar("relgate_host", default=None)
STRIPE: contextvars.ContextVar[int | None] = contextvars.ContextVar("relgate_stripe", default=None)
#: the topology version is read when a record is made (it changes while a job runs)
TOPOLOGY: contextvars.ContextVar[Callable[[], int] | None] = contextvars.ContextVar(
    "relgate_topology", default=None
)

# the LogRecord attributes a formatter adds the context as (also usable via ``extra=``)
FIELDS = ("job", "host", "stripe", "topology_version")
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


@contextlib.contextmanager
def bound(
    *,
    job: str | None = None,
    host: str | None = None,
    stripe: int | None = None,
    topology: Callable[[], int] | None = None,
) -> Iterator[None]:
    """Within the block, records made in this thread (context) carry these fields."""
    resets: list[Callable[[], None]] = []
    if job is not None:
        resets.append(functools.partial(JOB.reset, JOB.set(job)))
    if host is not None:
        resets.append(functools.partial(HOST.reset, HOST.set(host)))
    if stripe is not None:
        resets.append(functools.partial(STRIPE.reset, STRIPE.set(stripe)))
    if topology is not None:
        resets.append(functools.partial(TOPOLOGY.reset, TOPOLOGY.set(topology)))
    try:
        yield
    finally:
        for reset in reversed(resets):
            reset()


def bind(fn: Callable[[], None], **fields: Any) -> Callable[[], None]:
    """``fn`` run with ``fields`` bound on top of the caller's context (a thread's target:
    the new thread inherits the job of the thread that started it, then adds its own)."""
    ctx = contextvars.copy_context()

    def run() -> None:
        def inner() -> None:
            with bound(**fields):
                fn()

        ctx.run(inner)

    return run


class ContextFilter(logging.Filter):
    """Adds the context's fields (and the process's static ones) to every record."""

    def __init__(self, static: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.static = {k: v for k, v in (static or {}).items() if v not in (None, "")}

    def filter(self, record: logging.LogRecord) -> bool:
        topology = TOPOLOGY.get()
        known: dict[str, Any] = {
            "job": JOB.get(),
            "host": HOST.get(),
            "stripe": STRIPE.get(),
            "topology_version": topology() if topology is not None else None,
        }
        for name in FIELDS:
            if getattr(record, name, None) is None:
                value = known[name] if known[name] is not None else self.static.get(name)
                setattr(record, name, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601, ms), level, logger, msg; job, host,
    stripe and topology_version when known; exc (the traceback) when there is one; and any
    other ``extra=`` fields the call passed."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        out: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        for name, value in record.__dict__.items():
            if name not in _STANDARD and name not in out and name not in FIELDS:
                out[name] = value if isinstance(value, (str, int, float, bool)) else repr(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """The human line, with the known context in brackets after the logger's name."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(ctx)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            f"{k}={getattr(record, k)}" for k in FIELDS if getattr(record, k, None) is not None
        ]
        record.ctx = f" [{' '.join(parts)}]" if parts else ""
        return super().format(record)


def setup_logging(
    verbose: bool, log_format: LogFormat = "text", static: dict[str, Any] | None = None
) -> None:
    """The root logger writes to stderr in ``log_format``; ``static`` fields (e.g. the
    agent's host id) go on every record that has no value of its own for them."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter(static))
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
