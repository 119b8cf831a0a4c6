"""The authorization rules of both planes (relgate_agent.identity.authz), exact refusal texts.

Kept free of fixtures and heavy imports: it is the mutation-testing command for identity/authz.py
(``python -c "import test_authz_rules as t; t.run_all()"`` from agent/tests, or pytest).
"""

from __future__ import annotations

from relgate_agent.identity.authz import (
    AGENT_METHODS,
    OPERATOR_METHODS,
    chunk_refusal,
    live_targets,
    ready_refusal,
    rpc_check,
    rpc_refusal,
    stripe_refusal,
    topology_skew,
)
from relgate_agent.pki import Identity


def fresh(s: str) -> str:
    """A string equal to ``s`` but not the same object (certificates are parsed at run time,
    so a rule must compare values, never identities)."""
    return "".join(list(s))


OP = Identity(fresh("operator"), fresh("operator"))
H0 = Identity(fresh("host"), fresh("h00"), fresh("r0"))
H1 = Identity(fresh("host"), fresh("h01"), fresh("r1"))
CO = Identity(fresh("coordinator"), fresh("coordinator"))
# roles the parser never produces, sorting before and after every real one
ODD = (Identity("aaa", "x"), Identity("zzz", "x"))


def test_method_tables() -> None:
    assert {
        "CreateJob",
        "GetJob",
        "CancelJob",
        "EvictHost",
        "ClearHost",
        "EnrollHost",
        "ListHosts",
        "ListJobs",
        "GetJobTopology",
        "CreateEnrollToken",
        "ListEnrollRequests",
        "ApproveEnrollment",
        "RevokeCert",
    } == OPERATOR_METHODS
    assert {
        "Watch",
        "Register",
        "ReportProgress",
        "ReportStream",
        "ReportSuspect",
        "FindPeers",
        "RenewCert",
        "TrustBundle",
        "ListRevokedCerts",
    } == AGENT_METHODS


def test_every_rpc_of_the_proto_has_its_role() -> None:
    """A new RPC in the proto is authorized by role or refused as unknown: never both."""
    from relgate_agent.proto import distribution_pb2 as pb

    def names(service: str) -> set[str]:
        return {m.name for m in pb.DESCRIPTOR.services_by_name[service].methods}

    from relgate_agent.identity import crlwire

    assert names("JobService") | crlwire.OPERATOR_RPCS == OPERATOR_METHODS
    assert names("AgentService") | crlwire.AGENT_RPCS == AGENT_METHODS


def test_each_refusal_names_its_check() -> None:
    assert rpc_check("ListJobs", OP) is None
    assert rpc_check("ListJobs", H0) == (
        "operator-role",
        "ListJobs refused: operator RPC, caller is host:h00@r0",
    )
    assert rpc_check("GetJobTopology", None) == (
        "client-identity",
        "GetJobTopology refused: the client certificate carries no relgate identity",
    )
    assert (rpc_check("Watch", OP, "h00") or ("", ""))[0] == "agent-role"
    assert (rpc_check("Watch", H0, "h01") or ("", ""))[0] == "host-identity"
    assert (rpc_check("Watch", H0, "h00", "r1") or ("", ""))[0] == "host-rack"
    assert (rpc_check("Backdoor", OP) or ("", ""))[0] == "rpc-method"


# ---------------------------------------------------------------------------- control plane


def test_operator_methods_only_for_operators() -> None:
    for method in sorted(OPERATOR_METHODS):
        _operator_method(method)


def _operator_method(method: str) -> None:
    assert rpc_refusal(method, OP) is None
    assert (
        rpc_refusal(method, H0, "h00") == f"{method} refused: operator RPC, caller is host:h00@r0"
    )
    assert (
        rpc_refusal(method, CO)
        == f"{method} refused: operator RPC, caller is coordinator:coordinator"
    )
    assert rpc_refusal(method, None) == (
        f"{method} refused: the client certificate carries no relgate identity"
    )
    for odd in ODD:
        assert rpc_refusal(method, odd) == f"{method} refused: operator RPC, caller is {odd}"


def test_agent_methods_only_for_the_named_host() -> None:
    for method in sorted(AGENT_METHODS):
        _agent_method(method)


def _agent_method(method: str) -> None:
    assert rpc_refusal(method, H0, fresh("h00")) is None
    assert rpc_refusal(method, H0, fresh("h00"), fresh("r0")) is None
    for odd in ODD:
        assert rpc_refusal(method, odd, "x") == f"{method} refused: agent RPC, caller is {odd}"
    assert rpc_refusal(method, H1, "h01", "r0") == (
        f"{method} refused: certificate is for rack r1, request names rack 'r0'"
    )
    assert (
        rpc_refusal(method, OP, "h00")
        == f"{method} refused: agent RPC, caller is operator:operator"
    )
    assert rpc_refusal(method, CO, "h00") == (
        f"{method} refused: agent RPC, caller is coordinator:coordinator"
    )
    assert rpc_refusal(method, H0, "h01") == (
        f"{method} refused: certificate is for host h00, request names host 'h01'"
    )
    assert rpc_refusal(method, H0, "") == (
        f"{method} refused: certificate is for host h00, request names host ''"
    )
    assert rpc_refusal(method, H0, "h00", "r1") == (
        f"{method} refused: certificate is for rack r0, request names rack 'r1'"
    )
    assert rpc_refusal(method, None, "h00") is not None


def test_unknown_method_refused() -> None:
    assert rpc_refusal("Backdoor", OP) == "Backdoor refused: unknown method"
    assert rpc_refusal("Backdoor", H0, "h00") == "Backdoor refused: unknown method"


def test_ready_needs_every_chunk_and_the_placed_digest() -> None:
    d = "sha256:" + "a" * 64
    assert ready_refusal(25, 25, d, d) is None
    big = int("12500")  # not a cached small int
    assert ready_refusal(big, int("12500"), fresh(d), fresh(d)) is None
    low = "sha256:" + "0" * 64
    assert ready_refusal(25, 25, low, d) == f"READY refused: placed digest {low} is not {d}"
    assert ready_refusal(24, 25, d, d) == "READY refused: 24/25 chunks verified"
    assert ready_refusal(0, 25, d, d) == "READY refused: 0/25 chunks verified"
    assert ready_refusal(26, 25, d, d) == "READY refused: 26/25 chunks verified"
    assert ready_refusal(25, 25, "", d) == f"READY refused: placed digest (none) is not {d}"
    other = "sha256:" + "b" * 64
    assert ready_refusal(25, 25, other, d) == f"READY refused: placed digest {other} is not {d}"


def test_stripe_only_to_a_current_downstream() -> None:
    assert stripe_refusal(H1, "j", 2, {"h01", "h03"}, 7) is None
    assert stripe_refusal(H1, "j", 2, {"h03"}, 7) == (
        "refused: h01 is not a downstream of stripe 2 of job j (topology v7)"
    )
    assert stripe_refusal(H1, "j", 2, None, 7) == (
        "refused: h01 is not a downstream of stripe 2 of job j (topology v7)"
    )
    assert stripe_refusal(H1, "j", 2, set(), 7) is not None
    assert (
        stripe_refusal(OP, "j", 2, {"operator"}, 7)
        == "refused: peer operator:operator is not a host"
    )
    assert stripe_refusal(CO, "j", 2, {"coordinator"}, 7) == (
        "refused: peer coordinator:coordinator is not a host"
    )
    assert stripe_refusal(None, "j", 2, {"h01"}, 7) == "refused: peer None is not a host"


def test_chunk_only_to_a_job_peer() -> None:
    assert chunk_refusal(H1, "j", {"h00", "h01"}, 3) is None
    assert (
        chunk_refusal(OP, "j", {"operator"}, 3) == "refused: peer operator:operator is not a host"
    )
    assert chunk_refusal(H1, "j", {"h00"}, 3) == "refused: h01 is not a peer of job j (topology v3)"
    assert chunk_refusal(CO, "j", {"coordinator"}, 3) == (
        "refused: peer coordinator:coordinator is not a host"
    )
    assert chunk_refusal(None, "j", {"h01"}, 3) == "refused: peer None is not a host"


def test_topology_skew_of_a_member_is_stale_never_of_an_outsider() -> None:
    why = "refused: h01 is not a downstream of stripe 1 of job j (topology v2)"
    # the peer is behind us: it dials the upstream it had a moment ago
    assert topology_skew(why, True, 1, 2, 0) == f"stale topology v1 < v2: {why}"
    # our registration told us to act on v3 (our assignment is cleared until it comes):
    # a peer still on v2, the version we report, is behind the floor
    assert topology_skew(why, True, 2, 2, 3) == f"stale topology v2 < v3: {why}"
    # the peer is ahead and the bounded wait for its version ran out: we are behind
    assert topology_skew(why, True, 3, 2, 0) == f"stale topology here v2 < v3: {why}"
    assert topology_skew(why, True, 3, 2, 3) == f"stale topology here v2 < v3: {why}"
    # the same version and still refused: a real refusal, counted
    assert topology_skew(why, True, 2, 2, 0) == why
    assert topology_skew(why, True, 2, 2, 2) == why
    # a host outside the job, or a peer that names no version, is never excused
    for peer_version in (1, 2, 3):
        assert topology_skew(why, False, peer_version, 2, 0) == why
    assert topology_skew(why, True, 0, 2, 0) == why
    assert topology_skew(why, True, -1, 2, 0) == why


def test_live_targets_enrolled_seen_within_ttl_and_matching() -> None:
    enrolled = {
        "first-stale": ("r0", {"cluster": "x"}),  # a skipped host must not end the scan
        "a": ("r0", {"cluster": fresh("x")}),
        "b": ("r1", {"cluster": "x"}),
        "c": ("r0", {"cluster": "y"}),
        "stale": ("r0", {"cluster": "x"}),
        "never": ("r0", {"cluster": "x"}),
    }
    seen = {"a": 100.0, "b": 40.0, "c": 100.0, "stale": 39.9, "evil": 100.0}
    assert live_targets(enrolled, seen, 100.0, 60.0, {"cluster": fresh("x")}) == {
        "a": "r0",
        "b": "r1",
    }
    assert live_targets(enrolled, seen, 100.0, 60.0, {"cluster": "x", "rack": "r1"}) == {"b": "r1"}
    assert live_targets(enrolled, seen, 100.0, 60.0, {}) == {"a": "r0", "b": "r1", "c": "r0"}
    # a label cannot override the certificate's rack
    enrolled["d"] = ("r0", {"rack": "r9"})
    seen["d"] = 100.0
    assert "d" not in live_targets(enrolled, seen, 100.0, 60.0, {"rack": "r9"})


def run_all() -> None:
    """Every test, without pytest (fast enough to run once per mutant)."""
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
