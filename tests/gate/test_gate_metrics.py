"""The gate's metrics: every outcome is a catalog row, counted at scrape time.

Each case drives the real gate (a lost CAS, a refused admission, a fence advance that hits
held roots) and asserts the exact samples Prometheus would scrape, first in-process and then
from a real ``relgate gate metrics --listen`` process over HTTP.
"""

import os
import signal
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.runs import create_run

from relgate.catalog.db import rows
from relgate.errors import ConflictError, RejectedError, UsageError
from relgate.gate.telemetry import gate_registry
from relgate.gate.transitions import open_gate
from relgate.release.publication import publish

from .conftest import PURPOSE
from .test_gate_fast import _members


def _samples(registry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def _query(g, sql: str) -> list[dict]:
    with g.ws.db.tx() as conn:
        return rows(conn, sql)


def _drive(g) -> None:
    """One admission, a lost CAS, a tombstone hitting every root, a refused admission."""
    create_run(g.ws, purpose=PURPOSE, world_size=1, actor="sched", alias="train")
    with pytest.raises(ConflictError):
        publish(g.ws, g.r3, alias="train", actor="alice", expected_generation=1)
    member = _members(g)["sampleId"][4]
    open_gate(g.ws).add_tombstones([member], reason="gdpr", actor="dpo")
    with pytest.raises(RejectedError) as refused:
        create_run(g.ws, purpose=PURPOSE, world_size=1, actor="sched", alias="train")
    assert refused.value.check == "fence-hits"


EXPECTED = {
    ("relgate_gate_admissions_total", (("outcome", "ok"),)): 1,
    ("relgate_gate_admissions_total", (("outcome", "refused"),)): 1,
    # the template published R1 and R2 on train
    ("relgate_gate_alias_moves_total", (("operation", "activate"), ("outcome", "ok"))): 2,
    ("relgate_gate_alias_moves_total", (("operation", "activate"), ("outcome", "conflict"))): 1,
    (
        "relgate_gate_cas_conflicts_total",
        (("check", "alias-generation"), ("operation", "activate")),
    ): 1,
    ("relgate_gate_refusals_total", (("check", "fence-hits"), ("operation", "admit"))): 1,
    ("relgate_gate_fence_advances_total", (("fence", "tombstone"),)): 1,
    # the member is in S, R2 and R3 (R1, superseded and unheld, is not recorded)
    ("relgate_gate_fence_hits_total", (("fence", "tombstone"), ("kind", "release"))): 2,
    ("relgate_gate_fence_hits_total", (("fence", "tombstone"), ("kind", "snapshot"))): 1,
    ("relgate_gate_fence_watermark", (("fence", "tombstone"),)): 1,
    ("relgate_gate_fence_watermark", (("fence", "benchmark"),)): 0,
    # the one admitted run's permit was closed by the tombstone
    ("relgate_gate_permits", (("state", "CLOSED"),)): 1,
}


def test_every_gate_outcome_is_counted_and_a_refusal_survives_its_rollback(g):
    before = _query(g, "SELECT COUNT(*) AS n FROM alias_history")
    _drive(g)
    assert _samples(gate_registry(g.ws.db)) == EXPECTED
    # the lost CAS changed nothing but its own event row
    after = _query(g, "SELECT COUNT(*) AS n FROM alias_history")
    assert after == before
    events = _query(
        g,
        "SELECT operation, outcome, check_name, subject, digest FROM gate_events"
        " WHERE outcome != 'ok' ORDER BY id",
    )
    assert events == [
        {
            "operation": "activate",
            "outcome": "conflict",
            "check_name": "alias-generation",
            "subject": "train",
            "digest": g.r3,
        },
        {
            "operation": "admit",
            "outcome": "refused",
            "check_name": "fence-hits",
            "subject": events[1]["subject"],
            "digest": events[1]["digest"],
        },
    ]
    assert g.r2 in (events[1]["subject"], events[1]["digest"])


def test_a_usage_error_inside_the_gate_is_not_a_gate_decision(g):
    before = _query(g, "SELECT COUNT(*) AS n FROM gate_events")
    with pytest.raises(UsageError) as err:  # train is a release alias
        open_gate(g.ws).activate(
            "snapshot", "train", g.snapshot, expected_generation=None, actor="a"
        )
    assert err.value.check == "alias-kind"
    assert _query(g, "SELECT COUNT(*) AS n FROM gate_events") == before


def test_the_cli_serves_the_same_totals_over_http_and_stops_on_sigterm(g):
    _drive(g)
    env = os.environ | {"RELGATE_HOME": str(g.ws.home)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "relgate", "gate", "metrics", "--listen", "127.0.0.1:0", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "serving gate metrics on http://" in line, line
        url = line.split("on ", 1)[1].strip()
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - the loopback URL it printed
            text = resp.read().decode()
        scraped = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("relgate_gate_")
        }
        assert scraped == EXPECTED
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert '"stopped": true' in out


def test_a_port_in_use_is_a_usage_error_naming_it(g, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = os.environ | {"RELGATE_HOME": str(g.ws.home)}
        done = subprocess.run(
            [sys.executable, "-m", "relgate", "gate", "metrics", "--listen", f"127.0.0.1:{port}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    assert f"object=127.0.0.1:{port} check=listen" in done.stderr
