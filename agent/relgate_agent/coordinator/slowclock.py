"""Slowness evidence that outlives a leader.

A host is demoted after ``slow_after_s`` of slowness, judged against reference rates held
across rounds (:mod:`.slowness`). Both live in the leader's memory, so a leader killed 9 s
into a slow host's 10 s started a new leader's clock from zero, with a reference taken
from the slow host's victims: in the chaos lab the 30 %-NIC host stayed in every chain
for ~10 s more. The leader therefore writes, on change only, each host's slow clock (since
when, on the wall clock), its demotion and its first-slow-hop witnesses, and every
``REFERENCE_SAVE_S`` the held reference rates; a new leader resumes from them.

Only durations cross the handover (the store holds wall-clock instants; the coordinator's
own clock may be monotonic or simulated). The takeover gap counts as slowness (the old
leader's chains kept streaming behind the same host), but a host is credited with at most
``slow_after_s`` of it: one slow round under the new leader is still needed to demote it.
"""

from __future__ import annotations

from relgate_agent.coordinator.jobstate import HostProgress, JobState
from relgate_agent.coordinator.store import JobStore, RateReference, SlowRecord

REFERENCE_SAVE_S = 2.0  # the held reference is written at most this often


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


def _key(rec: SlowRecord | None) -> tuple[bool, frozenset[str]] | None:
    """What a change is: the clock started or stopped (a record or none), a demotion (a
    demoted host has no clock), new witnesses; the instant itself moves with every clock
    conversion and is not one."""
    return None if rec is None else (rec.demoted, rec.slow_with)


def save(store: JobStore, job: JobState, now: float, wall: float) -> None:
    """Write what changed since the last save (the caller holds the coordinator's lock)."""
    for h, hp in job.hosts.items():
        rec = slow_record(hp, now, wall)
        key = _key(rec)
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
    """Resume a loaded job's slow clocks, demotions, witnesses and held reference."""
    for h, rec in store.slowness(job.job_id).items():
        hp = job.hosts.get(h)
        if hp is None:
            continue
        hp.demoted, hp.slow_with = rec.demoted, rec.slow_with
        if rec.slow_since_ms > 0:  # 0: a demoted leaf, no clock
            slow_for = min(max(wall - rec.slow_since_ms / 1000, 0.0), slow_after_s)
            hp.slow_since = now - slow_for
        hp.slow_saved = _key(slow_record(hp, now, wall))
    ref = store.rate_reference(job.job_id)
    if ref is not None:
        job.rate_reference = (ref.stripe_bps, ref.total_bps)
        job.rate_reference_at = now - max(wall - ref.at_ms / 1000, 0.0)
        job.reference_saved_at = now


__all__ = ["REFERENCE_SAVE_S", "restore", "save", "slow_record"]
