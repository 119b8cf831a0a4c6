"""Retry: the one helper (tenacity) for every call the agent and the core try again.

A call is retried on the exceptions named, with a bounded exponential (or fixed) backoff,
for at most ``attempts`` tries (0 = until ``stop_event`` is set). Sleeping waits on
``stop_event``, so a shutdown interrupts a backoff at once. When the tries run out, the
stop event is set, or ``give_up`` says an error is final, the last exception is raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_never,
    stop_when_event_set,
    wait_exponential,
)
from tenacity.stop import stop_base

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Wait ``initial_s`` after the first failure, times ``multiplier`` after each next one,
    never more than ``max_s`` (``multiplier=1`` is a fixed wait)."""

    initial_s: float
    max_s: float = float("inf")
    multiplier: float = 2.0

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` consecutive failures (``failures >= 1``)."""
        return float(min(self.initial_s * self.multiplier ** max(failures - 1, 0), self.max_s))


def retry_call(
    fn: Callable[[], T],
    *,
    retry_on: type[BaseException] | tuple[type[BaseException], ...],
    backoff: Backoff,
    attempts: int = 0,
    stop_event: threading.Event | None = None,
    give_up: Callable[[BaseException], bool] | None = None,
    on_retry: Callable[[BaseException, int], None] | None = None,
) -> T:
    """``fn()``, retried as the module docstring says; ``on_retry(exc, failures)`` runs
    before each wait."""

    def retryable(exc: BaseException) -> bool:
        return isinstance(exc, retry_on) and not (give_up is not None and give_up(exc))

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if on_retry is not None and exc is not None:
            on_retry(exc, state.attempt_number)

    stop: stop_base = stop_after_attempt(attempts) if attempts > 0 else stop_never
    if stop_event is not None:
        stop = stop | stop_when_event_set(stop_event)
    retrying = Retrying(
        retry=retry_if_exception(retryable),
        wait=wait_exponential(
            multiplier=backoff.initial_s, max=backoff.max_s, exp_base=backoff.multiplier
        ),
        stop=stop,
        sleep=_waiter(stop_event),
        before_sleep=before_sleep,
        reraise=True,
    )
    last: list[BaseException] = []

    def attempt() -> T:
        # a stop event set during the wait ends the retries without another call
        if last and stop_event is not None and stop_event.is_set():
            raise last[0]
        try:
            return fn()
        except BaseException as exc:
            last[:] = [exc]
            raise

    return retrying(attempt)


def _waiter(event: threading.Event | None) -> Callable[[float], None]:
    """Sleep that a set ``event`` interrupts (a fresh, never-set event: a plain sleep)."""
    wake = event if event is not None else threading.Event()

    def sleep(seconds: float) -> None:
        wake.wait(seconds)

    return sleep


__all__ = ["Backoff", "retry_call"]
