"""The one retry helper (tenacity): attempts, give-up rule, stop event, backoff figures."""

from __future__ import annotations

import threading

import pytest
from relgate_trust.retry import Backoff, retry_call


class Flaky:
    def __init__(self, failures: int, exc: type[Exception] = OSError) -> None:
        self.failures, self.exc, self.calls = failures, exc, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc(f"failure {self.calls}")
        return "ok"


def test_retries_until_the_call_succeeds() -> None:
    fn = Flaky(3)
    seen: list[int] = []
    out = retry_call(
        fn, retry_on=OSError, backoff=Backoff(0.001), on_retry=lambda _e, n: seen.append(n)
    )
    assert out == "ok" and fn.calls == 4 and seen == [1, 2, 3]


def test_bounded_attempts_raise_the_last_error() -> None:
    fn = Flaky(10)
    with pytest.raises(OSError, match="failure 3"):
        retry_call(fn, retry_on=OSError, backoff=Backoff(0.001), attempts=3)
    assert fn.calls == 3


def test_other_errors_and_final_ones_are_not_retried() -> None:
    fn = Flaky(5, ValueError)
    with pytest.raises(ValueError, match="failure 1"):
        retry_call(fn, retry_on=OSError, backoff=Backoff(0.001))
    fn = Flaky(5)
    with pytest.raises(OSError, match="failure 1"):
        retry_call(fn, retry_on=OSError, backoff=Backoff(0.001), give_up=lambda _e: True)
    assert fn.calls == 1


def test_a_set_stop_event_ends_the_retries() -> None:
    stop = threading.Event()
    fn = Flaky(1000)

    def on_retry(_exc: BaseException, failures: int) -> None:
        if failures == 1:
            stop.set()  # shutting down while the first 60 s wait is about to start

    with pytest.raises(OSError, match="failure 1"):
        retry_call(fn, retry_on=OSError, backoff=Backoff(60.0), stop_event=stop, on_retry=on_retry)
    assert fn.calls == 1  # the wait ends at once and no further call is made


def test_backoff_figures() -> None:
    assert [Backoff(0.2, 2.0).delay(n) for n in range(1, 7)] == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert [Backoff(1.0, multiplier=1.0).delay(n) for n in (1, 5)] == [1.0, 1.0]
