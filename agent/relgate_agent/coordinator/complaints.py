"""Complaints: when a downstream's STALLED / CONN_RESET / BAD_DATA counts against a host.

A complaint is one host's word against another, and a broken reporter has a word against
everyone: a host whose certificate expired, whose CA bundle is wrong or whose outbound TLS
a firewall drops fails every data-plane handshake and reports CONN_RESET against each
upstream in turn (before: all 7 other hosts of a job were demoted, topology v1 -> v17, and
the job stuck at 7/8). So a complaint counts against the accused only when corroborated:

* a **second independent reporter** complains about the same host (independent: not
  itself the suspect of this module), or
* **the accused's own rates** agree: it reports sending nothing (``tx_bps`` 0) while the
  reporter reports receiving from someone (``rx_bps`` > 0: its handshakes work
  elsewhere), unless the complaint is STALLED and the accused receives nothing itself (a
  stall its own upstream explains). An accused that serves others, or a reporter that receives from nobody, is
  a dispute between two hosts, not evidence against one.

A reporter is itself **the suspect** when its uncorroborated complaints name
``AGAINST_EVERYONE`` distinct hosts or more (it fails with everyone it meets), or when it
complains and is complained about with CONN_RESET (a failed handshake, not a stall that
an empty upstream explains), uncorroborated on both sides (its handshakes fail in both
directions): it is removed from the job (``REMOVED``, its reason in its errors, its
complaints withdrawn), never the hosts it named.

BAD_DATA keeps its own rule (two independent receivers quarantine, ``progress.py``): a
second reporter is its corroboration, and a reporter judged the suspect is not counted.
"""

from __future__ import annotations

from relgate_agent.coordinator.jobstate import GONE_STATES, HostProgress, JobState

AGAINST_EVERYONE = 2  # distinct hosts a reporter's uncorroborated complaints may name
CONN_RESET, STALLED = "CONN_RESET", "STALLED"


def complaints_by(job: JobState, reporter: str) -> set[str]:
    """The live hosts ``reporter`` has an active complaint against (not serving it, or
    bad data)."""
    return {
        h
        for h, hp in job.hosts.items()
        if h != reporter
        and hp.state not in GONE_STATES
        and (reporter in hp.unserved or reporter in hp.bad_data_reporters)
    }


def complainants(hp: HostProgress) -> set[str]:
    return set(hp.unserved) | set(hp.bad_data_reporters)


def corroboration(job: JobState, accused: HostProgress, reporter: str) -> str | None:
    """Why ``reporter``'s complaint against ``accused`` is more than its word (None: it is
    not): a second reporter, or the accused's own rates."""
    others = sorted(
        r
        for r in complainants(accused) - {reporter}
        if r in job.hosts and job.hosts[r].state not in GONE_STATES
    )
    if others:
        return f"also from {', '.join(others)}"
    rep = job.hosts.get(reporter)
    if accused.tx_bps != 0 or rep is None or rep.rx_bps <= 0:
        return None
    if (
        accused.unserved_reason.get(reporter) == STALLED
        and accused.rx_bps <= 0
        and not accused.ready
    ):
        return None  # it has nothing to pass on: its own upstream's stall, not its fault
    return f"it sends 0 B/s while {reporter} receives {rep.rx_bps} B/s from others"


def suspect_reporter(job: JobState, reporter: str) -> str | None:
    """Why ``reporter`` is itself the suspect (None: it is not)."""
    hp = job.hosts.get(reporter)
    if hp is None or hp.state in GONE_STATES:
        return None
    alone = sorted(
        h
        for h in complaints_by(job, reporter)
        if corroboration(job, job.hosts[h], reporter) is None
    )
    if len(alone) >= AGAINST_EVERYONE:
        return f"complains against everyone it meets ({', '.join(alone)}), corroborated by nobody"
    against = sorted(
        r
        for r, why in hp.unserved_reason.items()
        if why == CONN_RESET and r in hp.unserved and corroboration(job, hp, r) is None
    )
    if alone and against:
        return (
            f"handshakes fail both ways: it complains against {', '.join(alone)} and "
            f"{', '.join(against)} against it, corroborated by nobody"
        )
    return None


def withdraw(job: JobState, reporter: str) -> None:
    """Forget every complaint ``reporter`` made (it was judged the suspect)."""
    for hp in job.hosts.values():
        hp.unserved.pop(reporter, None)
        hp.unserved_reason.pop(reporter, None)
        hp.bad_data_reporters.discard(reporter)


__all__ = [
    "AGAINST_EVERYONE",
    "complainants",
    "complaints_by",
    "corroboration",
    "suspect_reporter",
    "withdraw",
]
