"""Slowness evidence that outlives a leader.

A host is demoted after ``slow_after_s`` of slowness, judged against reference rates held
across rounds (:mod:`.slowness`). Both live in the leader's memory, so a leader killed 9 s
into a slow host's 10 s started a new leader's clock from zero, with a reference taken
from the slow host's victims: in the chaos lab the 30 %-NIC host stayed in every chain
for ~10 s more. The leader therefore writes, on change only, each host's slow clock (since
when, on the wall clock), its demotion and its first-slow-hop witnesses, and every
``REFERENCE_SAVE_S`` the held reference rates; a new leader resumes from them.

Only evidence somebody gathered counts: a restored clock is credited with the slowness
the old leader watched (from its start to the old leader's last judging round, the
reference's instant: written while it judged, every ``REFERENCE_SAVE_S`` at most, so the
credit errs short), never with the takeover gap nobody watched, nor with the new leader's
grace (:mod:`.failover`) during which rates are the takeover's, not the hosts'. The credit
is applied when the new leader first sees the host slow again; a host it first sees fast
has no clock and its stored one is dropped.
"""

from __future__ import annotations

from relgate_agent.coordinator.jobstate import HostProgress, JobState, SlowKey
from relgate_agent.coordinator.store import JobStore, RateReference, SlowRecord

REFERENCE_SAVE_S = 2.0  # the held reference is written at most this often
RESTORED: SlowKey = (False, frozenset(), -1.0)  # a restored clock: the next save rewrites it


def slow_record(hp: HostProgress, now: float, wall: float) -> SlowRecord | None:
    """What the store should hold for ``hp`` (None: nothing, it is neither slow nor
    demoted); ``now`` on the coordinator's clock, ``wall`` the wall clock at that moment."""
    if hp.slow_since is None and not hp.demoted:
        return None
    if hp.demoted or hp.slow_since is None:  # a leaf has no clock (the sweep that demotes
        since = 0  # a host still holds its clock until the next one clears it)
    else:
        since = max(1, int((wall - (now - hp.slow_since)) * 1000))
    return SlowRecord(since, hp.demoted, hp.slow_with)


def _key(hp: HostProgress, rec: SlowRecord | None) -> SlowKey | None:
    """What a change is: the clock started, restarted or stopped (its start on the
    coordinator's own clock, which a wall-clock conversion does not move), a demotion (a
    demoted host has no clock), new witnesses."""
    if rec is None:
        return None
    return (rec.demoted, rec.slow_with, None if rec.demoted else hp.slow_since)


def save(store: JobStore, job: JobState, now: float, wall: float) -> None:
    """Write what changed since the last save (the caller holds the coordinator's lock)."""
    for h, hp in job.hosts.items():
        rec = slow_record(hp, now, wall)
        key = _key(hp, rec)
        if key == hp.slow_saved:
            continue
        if rec is None:
            store.drop_slowness(job.job_id, h)
        else:
            store.put_slowness(job.job_id, h, rec)
        hp.slow_saved = key
    ref = job.rate_reference
    if ref and (job.reference_saved_at is None or now - job.reference_saved_at >= REFERENCE_SAVE_S):
        store.put_rate_reference(job.job_id, RateReference(ref[0], ref[1], int(wall * 1000)))
        job.reference_saved_at = now


def restore(store: JobStore, job: JobState, now: float, wall: float, slow_after_s: float) -> None:
    """Resume a loaded job's demotions, witnesses and held reference; each running slow
    clock becomes a credit of the slowness the old leader watched (at most
    ``slow_after_s``), applied when this leader first judges the host slow."""
    ref = store.rate_reference(job.job_id)
    watched_until_ms = ref.at_ms if ref is not None else 0
    for h, rec in store.slowness(job.job_id).items():
        hp = job.hosts.get(h)
        if hp is None:
            continue
        hp.demoted, hp.slow_with = rec.demoted, rec.slow_with
        hp.slow_since = None
        if rec.slow_since_ms > 0 and not rec.demoted:  # 0: a demoted leaf, no clock
            watched = max(watched_until_ms - rec.slow_since_ms, 0) / 1000
            hp.slow_credit = min(watched, slow_after_s)
            hp.slow_saved = RESTORED
        else:
            hp.slow_saved = _key(hp, slow_record(hp, now, wall))
    if ref is not None:
        job.rate_reference = (ref.stripe_bps, ref.total_bps)
        job.rate_reference_at = now - max(wall - ref.at_ms / 1000, 0.0)
        job.reference_saved_at = now


__all__ = ["REFERENCE_SAVE_S", "RESTORED", "restore", "save", "slow_record"]
