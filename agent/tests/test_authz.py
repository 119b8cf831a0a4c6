"""Identities, the CA, and the data-plane request parser (hypothesis for the parsers)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relgate_agent.dataplane.transport import MAGIC, REQ, RequestError, _int_field, parse_request
from relgate_agent.pki import (
    Identity,
    PkiError,
    ca_init,
    cert_info,
    check_name,
    ensure_dev_pki,
    identity_from_peercert,
    identity_from_pem,
    identity_from_uris,
    identity_uri,
    issue,
    parse_identity_uri,
)

OP = Identity("operator", "operator")
H0 = Identity("host", "h00", "r0")
H1 = Identity("host", "h01", "r1")
CO = Identity("coordinator", "coordinator")


# ---------------------------------------------------------------------------- identities


def _fresh(s: str) -> str:
    return "".join(list(s))  # equal, not identical: rules must compare values


def test_names_san_types_and_bad_pem() -> None:
    for ok in ("h00", "a", "A.b_c-9", "x" * 128):
        assert check_name("host id", ok) == ok
    for bad in ("", ".h", "-h", "h/0", "h 0", "x" * 129, "h\n"):
        with pytest.raises(PkiError, match="is not a valid name"):
            check_name("host id", bad)
    with pytest.raises(PkiError, match="is not a valid name"):
        check_name("host id", 5)  # type: ignore[arg-type]
    assert identity_uri(_fresh("host"), "h00", "r0") == "spiffe://relgate/host/h00?rack=r0"
    # only URI entries count, whatever other SAN types carry
    for other in ("DNS", "email", "IP Address"):
        san = ((other, H1.uri), (_fresh("URI"), H0.uri))
        assert identity_from_peercert({"subjectAltName": san}) == H0, other
    assert (
        identity_from_pem(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n") is None
    )
    assert identity_from_pem(b"") is None


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
        "spiffe://relgate/host",  # no name segment
        "spiffe://relgate/",
        "spiffe://relgate/host/h00?rack=",
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
    # a new CA (the old one expired or was removed) re-issues every certificate under it
    (d / "ca.key").unlink()
    old = (d / "operator.pem").read_bytes()
    ensure_dev_pki(tmp_path / "home", {"h00": "r1"})
    assert (d / "operator.pem").read_bytes() != old


# ---------------------------------------------------------------------------- request parser


def _req(op: int, body: bytes, magic: bytes = MAGIC) -> tuple[bytes, bytes]:
    return REQ.pack(magic, op, len(body)), body


def _parse(head: bytes, body: bytes, max_header: int = 4096) -> tuple[int, dict[str, object]]:
    return parse_request(head, lambda n: body[:n], max_header)


MALFORMED_CASES = [
    (_req(1, b'{"job":"j"}', b"XXXX"), "bad magic"),
    (_req(1, b'{"job":"j"}', b"AAAA"), "bad magic"),
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
    (_req(1, json.dumps({"job": "j" * 129}).encode()), "job must be a non-empty string"),
]


@pytest.mark.parametrize(("head_body", "message"), MALFORMED_CASES)
def test_malformed_requests(head_body: tuple[bytes, bytes], message: str) -> None:
    with pytest.raises(RequestError) as exc:
        _parse(*head_body)
    assert str(exc.value) == message and exc.value.kind == "malformed"


def test_int_fields() -> None:
    req = {"i": 5, "b": True, "f": 1.0, "s": "5", "n": None, "neg": -1}
    assert _int_field(req, "i", 0, 5) == 5
    assert _int_field(req, "i", 5, 9) == 5
    assert _int_field(req, "missing", 0, 9, 3) == 3
    assert _int_field(req, "neg", -1, 0) == -1
    for name in ("b", "f", "s", "n", "missing"):
        with pytest.raises(RequestError) as exc:
            _int_field(req, name, 0, 9)
        assert str(exc.value) == f"{name} must be an integer" and exc.value.kind == "malformed"
    with pytest.raises(RequestError, match=r"^i 5 out of range \[0, 4\]$"):
        _int_field(req, "i", 0, 4)
    with pytest.raises(RequestError, match=r"^i 5 out of range \[6, 9\]$"):
        _int_field(req, "i", 6, 9)


def test_request_at_the_size_limit_is_parsed() -> None:
    _, req = _parse(*_req(1, json.dumps({"job": "j" * 128}).encode()))
    assert req["job"] == "j" * 128
    body = json.dumps({"job": "j", "pad": "x" * 10}).encode()
    op, req = _parse(*_req(2, body), max_header=len(body))
    assert op == 2 and req["job"] == "j"
    op, req = _parse(*_req(1, b'{"job":"j"}'))
    assert op == 1


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


def run_parsers() -> None:
    """The deterministic identity and request-parser tests without pytest's runner (the
    mutation-testing command; the hypothesis tests run under pytest)."""
    test_identity_uri_roundtrip_and_refusals()
    test_names_san_types_and_bad_pem()
    for head_body, message in MALFORMED_CASES:
        test_malformed_requests(head_body, message)
    test_int_fields()
    test_request_at_the_size_limit_is_parsed()
