"""Failover: what a leader that took over (or restarted) may judge, and when.

A leader loads its jobs from the store with no progress: the hosts' reports went to the
old leader, or are stuck on it. A frozen leader (SIGSTOP, a hung VM) holds each agent's
report for up to the agent's reply timeout, and the agent's watch notices the silence only
after its keepalive runs out; only then does it move to the next replica. So the new
leader waits at least that long (plus one report interval, for the first report to
arrive) before it judges a host dead that it never heard from, and judges no slowness
meanwhile: rates across a takeover are the takeover's. A host that did report to it and
then went silent is judged by the usual ``dead_after_s``: it had its chance.

The grace is derived from the agents' own settings (:mod:`relgate_agent.rpc`), never a
separate constant: change the reply timeout or the keepalive and the grace follows.
"""

from __future__ import annotations

from relgate_agent.coordinator.jobstate import CoordinatorConfig, HostProgress, JobState
from relgate_agent.rpc import RECONNECT_S, REPORT_REPLY_TIMEOUT_S


def takeover_grace_s(config: CoordinatorConfig) -> float:
    """How long after loading a job a leader waits before judging a silent host dead."""
    return max(config.dead_after_s, REPORT_REPLY_TIMEOUT_S + RECONNECT_S + config.report_interval_s)


def in_grace(job: JobState, now: float, config: CoordinatorConfig) -> bool:
    """No slowness is judged: the job was loaded by this leader less than the grace ago and
    some host of its chains has not yet sent it rates for a whole report interval.

    The grace ends early once every host in the chains that has moved over has sent rates
    for an interval: their rates are the data plane's (it never stopped), measured by the
    hosts themselves, and a tx-slow host must not drag its chains for a whole grace after
    each takeover (the chaos lab's two takeovers held judgement for ~50 s). A host this
    leader never heard from does not hold it: its hops are no evidence
    (``HandoffService._unjudged``) until it reports, and at the grace's end it is dead
    (hosts killed with the old leader held judgement for the whole grace while the
    tx-slow host dragged their chains)."""
    if job.resumed_at is None or now - job.resumed_at >= takeover_grace_s(config):
        return False
    interval = config.report_interval_s
    for h in job.topology.racks:
        hp = job.hosts.get(h)
        if hp is None or hp.ready or not hp.reported:  # placed (judged no more), or unheard
            continue
        if hp.rates_since is None or now - hp.rates_since < interval:
            return True
    return False


def stopped_reporting(hp: HostProgress, now: float, config: CoordinatorConfig) -> bool:
    """No report from ``hp`` for two report intervals: a suspect that also went quiet is
    dead at once (ReportSuspect), and its hops are no evidence of slowness (handoff)."""
    return now - hp.last_seen > 2 * config.report_interval_s


def dead_limit(hp: HostProgress, job: JobState, config: CoordinatorConfig) -> float:
    """The silence after which ``hp`` is dead: ``dead_after_s`` for a host this leader
    heard from (or a job it created), the takeover grace for one it never heard from."""
    if hp.reported or job.resumed_at is None:
        return config.dead_after_s
    return takeover_grace_s(config)


__all__ = ["dead_limit", "in_grace", "stopped_reporting", "takeover_grace_s"]
