"""Authorization rules and the parsers in front of them (pure functions; hypothesis for parsers)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from relgate_agent.authz import (
    AGENT_METHODS,
    OPERATOR_METHODS,
    chunk_refusal,
    live_targets,
    ready_refusal,
    rpc_refusal,
    stripe_refusal,
)
from relgate_agent.pki import (
    Identity,
    PkiError,
    ca_init,
    cert_info,
    ensure_dev_pki,
    identity_from_peercert,
    identity_from_uris,
    identity_uri,
    issue,
    parse_identity_uri,
)
from relgate_agent.transport import MAGIC, REQ, RequestError, parse_request

OP = Identity("operator", "operator")
H0 = Identity("host", "h00", "r0")
H1 = Identity("host", "h01", "r1")
CO = Identity("coordinator", "coordinator")


# ---------------------------------------------------------------------------- control plane


@pytest.mark.parametrize("method", sorted(OPERATOR_METHODS))
def test_operator_methods_only_for_operators(method: str) -> None:
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


@pytest.mark.parametrize("method", sorted(AGENT_METHODS))
def test_agent_methods_only_for_the_named_host(method: str) -> None:
    assert rpc_refusal(method, H0, "h00") is None
    assert rpc_refusal(method, H0, "h00", "r0") is None
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
    assert stripe_refusal(None, "j", 2, {"h01"}, 7) == "refused: peer None is not a host"


def test_chunk_only_to_a_job_peer() -> None:
    assert chunk_refusal(H1, "j", {"h00", "h01"}, 3) is None
    assert chunk_refusal(H1, "j", {"h00"}, 3) == "refused: h01 is not a peer of job j (topology v3)"
    assert chunk_refusal(CO, "j", {"coordinator"}, 3) == (
        "refused: peer coordinator:coordinator is not a host"
    )
    assert chunk_refusal(None, "j", {"h01"}, 3) == "refused: peer None is not a host"


def test_live_targets_enrolled_seen_within_ttl_and_matching() -> None:
    enrolled = {
        "a": ("r0", {"cluster": "x"}),
        "b": ("r1", {"cluster": "x"}),
        "c": ("r0", {"cluster": "y"}),
        "stale": ("r0", {"cluster": "x"}),
        "never": ("r0", {"cluster": "x"}),
    }
    seen = {"a": 100.0, "b": 40.0, "c": 100.0, "stale": 39.9, "evil": 100.0}
    assert live_targets(enrolled, seen, 100.0, 60.0, {"cluster": "x"}) == {"a": "r0", "b": "r1"}
    assert live_targets(enrolled, seen, 100.0, 60.0, {"cluster": "x", "rack": "r1"}) == {"b": "r1"}
    assert live_targets(enrolled, seen, 100.0, 60.0, {}) == {"a": "r0", "b": "r1", "c": "r0"}
    # a label cannot override the certificate's rack
    enrolled["d"] = ("r0", {"rack": "r9"})
    seen["d"] = 100.0
    assert "d" not in live_targets(enrolled, seen, 100.0, 60.0, {"rack": "r9"})


# ---------------------------------------------------------------------------- identities


def test_identity_uri_roundtrip_and_refusals() -> None:
    for ident in (H0, OP, CO):
        assert parse_identity_uri(ident.uri) == ident
    assert identity_uri("host", "h00", "r0") == "spiffe://relgate/host/h00?rack=r0"
    for bad in (
        "spiffe://relgate/host/h00",  # no rack
        "spiffe://relgate/host/h00?rack=r0&rack=r1",
        "spiffe://relgate/admin/x",
        "spiffe://other/host/h00?rack=r0",
        "spiffe://relgate/host/h00/x?rack=r0",
        "spiffe://relgate/operator/op?rack=r0",
        "spiffe://relgate/host/..?rack=r0",
        "spiffe://relgate/host/h00?rack=r0#frag",
        "https://relgate/host/h00?rack=r0",
        "",
    ):
        assert parse_identity_uri(bad) is None, bad
    assert identity_from_uris([H0.uri, H1.uri]) is None  # ambiguous
    assert identity_from_uris(["https://example", H0.uri]) == H0
    assert identity_from_peercert({"subjectAltName": (("URI", H0.uri), ("DNS", "x"))}) == H0
    assert identity_from_peercert({"subjectAltName": (("DNS", "h00"),)}) is None
    assert identity_from_peercert(None) is None


@given(st.text(max_size=80))
def test_identity_parser_never_raises(s: str) -> None:
    ident = parse_identity_uri(s)
    if ident is not None:
        assert parse_identity_uri(ident.uri) == ident


@given(
    st.sampled_from(["host", "operator", "coordinator"]),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
)
def test_identity_uri_roundtrip(role: str, name: str, rack: str) -> None:
    r = rack if role == "host" else ""
    assert parse_identity_uri(identity_uri(role, name, r)) == Identity(role, name, r)


def test_ca_issue_files_and_roles(tmp_path: Path) -> None:
    ca_init(tmp_path)
    with pytest.raises(PkiError, match="a CA already exists"):
        ca_init(tmp_path)
    cert, key = issue(tmp_path, "host", host_id="h00", rack="r0", validity_h=2)
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "ca.key").st_mode) == 0o600
    info = cert_info(cert)
    assert info["identity"] == "spiffe://relgate/host/h00?rack=r0" and info["rack"] == "r0"
    with pytest.raises(PkiError, match="not a valid name"):
        issue(tmp_path, "host", host_id="../x", rack="r0")
    with pytest.raises(PkiError, match="unknown role"):
        issue(tmp_path, "root")
    with pytest.raises(PkiError, match="only for host"):
        issue(tmp_path, "operator", rack="r0")
    with pytest.raises(PkiError, match="out of range"):
        issue(tmp_path, "operator", validity_h=0)
    assert not list(tmp_path.glob("*.tmp"))
    d = ensure_dev_pki(tmp_path / "home", {"h00": "r0"})
    before = (d / "h00.pem").read_bytes()
    ensure_dev_pki(tmp_path / "home", {"h00": "r0"})  # fresh: kept
    assert (d / "h00.pem").read_bytes() == before
    ensure_dev_pki(tmp_path / "home", {"h00": "r1"})  # rack changed: reissued
    assert cert_info(d / "h00.pem")["rack"] == "r1"


# ---------------------------------------------------------------------------- request parser


def _req(op: int, body: bytes, magic: bytes = MAGIC) -> tuple[bytes, bytes]:
    return REQ.pack(magic, op, len(body)), body


def _parse(head: bytes, body: bytes, max_header: int = 4096) -> tuple[int, dict[str, object]]:
    return parse_request(head, lambda n: body[:n], max_header)


@pytest.mark.parametrize(
    ("head_body", "message"),
    [
        (_req(1, b'{"job":"j"}', b"XXXX"), "bad magic"),
        (_req(9, b'{"job":"j"}'), "unknown op 9"),
        (_req(0, b'{"job":"j"}'), "unknown op 0"),
        (_req(1, b"[1,2]"), "request header is not a JSON object"),
        (_req(1, b"not json"), "request header is not JSON"),
        (_req(1, b"\xff\xfe"), "request header is not JSON"),
        (_req(1, b'{"job": 5}'), "job must be a non-empty string"),
        (_req(1, b'{"job": ""}'), "job must be a non-empty string"),
        (_req(1, b"{}"), "job must be a non-empty string"),
        ((REQ.pack(MAGIC, 1, 5000), b""), "request header too large (5000 > 4096 bytes)"),
        ((REQ.pack(MAGIC, 1, 4097), b""), "request header too large (4097 > 4096 bytes)"),
    ],
)
def test_malformed_requests(head_body: tuple[bytes, bytes], message: str) -> None:
    with pytest.raises(RequestError) as exc:
        _parse(*head_body)
    assert str(exc.value) == message and exc.value.kind == "malformed"


def test_request_at_the_size_limit_is_parsed() -> None:
    body = json.dumps({"job": "j", "pad": "x" * 10}).encode()
    op, req = _parse(*_req(2, body), max_header=len(body))
    assert op == 2 and req["job"] == "j"
    op, req = _parse(*_req(1, b'{"job":"j"}'))
    assert op == 1


@settings(max_examples=300)
@given(st.binary(min_size=REQ.size, max_size=REQ.size), st.binary(max_size=64))
def test_parser_only_ever_raises_request_error(head: bytes, body: bytes) -> None:
    try:
        op, req = _parse(head, body)
    except RequestError:
        return
    assert op in (1, 2) and isinstance(req, dict) and isinstance(req["job"], str)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c) | st.dictionaries(st.text(max_size=5), c),
        max_leaves=8,
    )
)
def test_parser_any_json(doc: object) -> None:
    body = json.dumps(doc).encode()
    try:
        _, req = _parse(*_req(1, body))
    except RequestError as exc:
        assert str(exc) in ("request header is not a JSON object", "job must be a non-empty string")
        return
    assert isinstance(req, dict)
