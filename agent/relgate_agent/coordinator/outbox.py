"""Outbox: the deployer handoff, durable and idempotent.

Every event for the deployer (``DistributionComplete`` once per job, then ``HostsReady`` for
the hosts that became READY after it) is first written to the store's outbox table, then
POSTed to the job's webhook until the webhook answers 2xx; only a 2xx marks it delivered.
A failed POST (connection refused, timeout, any non-2xx, a redirect) is retried with a
bounded exponential backoff (:class:`relgate_trust.retry.Backoff`), scheduled in the row,
so a restarted coordinator or a new leader resumes where the last one stopped.

Each event carries a stable id, derived from what it announces (job, type, hosts), sent as
the ``Idempotency-Key`` header and the body's ``eventId``: a POST retried after a lost
answer, or repeated by a deposed leader, is the same event, and the deployer drops it by
that id. Delivery is in order per job: a job's later event waits for its earlier one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from http.client import HTTPException
from typing import Protocol

from relgate_trust.retry import Backoff

from relgate_agent.coordinator.store import JobStore, OutboxRow

log = logging.getLogger(__name__)

EVENT_COMPLETE = "DistributionComplete"
EVENT_HOSTS_READY = "HostsReady"
IDEMPOTENCY_HEADER = "Idempotency-Key"
POST_TIMEOUT_S = 10.0
MAX_ANSWER_BYTES = 64 * 1024  # a webhook's answer is read (bounded) and ignored


class Post(Protocol):
    """POST ``body`` to ``url`` with ``headers``; raise OSError unless it answered 2xx."""

    def __call__(self, url: str, body: bytes, headers: Mapping[str, str]) -> None: ...


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is not an acknowledgement: urllib would replay the POST as a GET."""

    def redirect_request(self, *_args: object, **_kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect())


def http_post(url: str, body: bytes, headers: Mapping[str, str]) -> None:
    req = urllib.request.Request(  # noqa: S310 - the operator's webhook URL (http/https)
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", **headers},
    )
    with _OPENER.open(req, timeout=POST_TIMEOUT_S) as resp:
        resp.read(MAX_ANSWER_BYTES)
        if not 200 <= resp.status < 300:  # noqa: PLR2004 - the 2xx range
            raise urllib.error.HTTPError(url, resp.status, "not 2xx", resp.headers, None)


def event_id(job_id: str, kind: str, hosts: Sequence[str] = ()) -> str:
    """Stable id of the event that tells ``kind`` (and ``hosts``) of ``job_id``."""
    named = "" if kind == EVENT_COMPLETE else ",".join(sorted(hosts))
    return "ev_" + hashlib.sha256(f"{job_id}\n{kind}\n{named}".encode()).hexdigest()[:32]


Seal = Callable[[dict[str, object]], dict[str, object]]


def outbox_row(
    job_id: str,
    kind: str,
    url: str,
    hosts: Sequence[str],
    payload: Mapping[str, object],
    seal: Seal | None = None,
) -> OutboxRow:
    """The event as enqueued: its id in the body, signed by ``seal`` (the coordinator's
    key, over every field, the id included); no webhook means nobody to tell (delivered)."""
    eid = event_id(job_id, kind, hosts)
    event: dict[str, object] = {**payload, "eventId": eid}
    body = json.dumps(seal(event) if seal else event, sort_keys=True).encode()
    delivered = 0 if url else int(time.time() * 1000)
    return OutboxRow(eid, job_id, kind, url, tuple(sorted(hosts)), body, delivered_at_ms=delivered)


class OutboxSender:
    """Delivers due events (one pass at a time) and schedules retries in the store."""

    def __init__(
        self,
        store: JobStore,
        post: Post,
        backoff: Backoff,
        on_delivered: Callable[[OutboxRow], None],
    ) -> None:
        self.store, self.post, self.backoff = store, post, backoff
        self.on_delivered = on_delivered

    def deliver_due(
        self, keep_going: Callable[[], bool], mine: Callable[[str], bool] = lambda _job: True
    ) -> float | None:
        """POST every due event of the jobs ``mine`` accepts (a job's in order); seconds
        until the next retry is due, or None when nothing is pending."""
        next_due: float | None = None
        blocked: set[str] = set()  # jobs whose earlier event is not delivered yet
        for row in self.store.pending_events():
            if not keep_going():
                return None
            if row.job_id in blocked or not mine(row.job_id):
                continue
            wait_s = (row.next_attempt_at_ms - time.time() * 1000) / 1000
            if wait_s <= 0:
                if self._send(row):
                    continue
                wait_s = self.backoff.delay(row.attempts + 1)
            blocked.add(row.job_id)
            next_due = wait_s if next_due is None else min(next_due, wait_s)
        return next_due

    def _send(self, row: OutboxRow) -> bool:
        try:
            self.post(row.url, row.body, {IDEMPOTENCY_HEADER: row.event_id})
        except (OSError, ValueError, HTTPException) as exc:  # refused, timeout, non-2xx, bad URL
            delay = self.backoff.delay(row.attempts + 1)
            log.warning(
                "%s %s of job %s to %s failed (attempt %d, next in %.1fs): %s",
                row.kind,
                row.event_id,
                row.job_id,
                row.url,
                row.attempts + 1,
                delay,
                exc,
            )
            self.store.mark_event_failed(
                row.event_id, int((time.time() + delay) * 1000), f"{type(exc).__name__}: {exc}"
            )
            return False
        self.store.mark_event_delivered(row.event_id, int(time.time() * 1000))
        log.info("%s %s of job %s delivered", row.kind, row.event_id, row.job_id)
        self.on_delivered(row)
        return True


__all__ = [
    "EVENT_COMPLETE",
    "EVENT_HOSTS_READY",
    "IDEMPOTENCY_HEADER",
    "POST_TIMEOUT_S",
    "OutboxSender",
    "Post",
    "Seal",
    "event_id",
    "http_post",
    "outbox_row",
]
