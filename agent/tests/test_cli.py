"""relgate-agent command line (click): flags as before, camelCase --json, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relgate_agent.cli import EXIT_OK, EXIT_REJECTED, EXIT_USAGE, main
from relgate_agent.cli.params import expand_greedy_args, parse_rate


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    rc = main(list(argv))
    out = capsys.readouterr().out.strip().splitlines()
    return rc, json.loads(out[-1]) if out else {}


def test_trusted_keys_takes_every_value_up_to_the_next_option() -> None:
    argv = ["verify", "m", "v", "--trusted-keys", "a", "b", "--keep", "--trusted-keys=c"]
    assert expand_greedy_args(argv) == [
        "verify",
        "m",
        "v",
        "--trusted-keys",
        "a",
        "--trusted-keys",
        "b",
        "--keep",
        "--trusted-keys=c",
    ]


def test_rates() -> None:
    assert parse_rate("100Mbit") == 12_500_000 and parse_rate("64MiB") == 64 * 1024**2
    with pytest.raises(ValueError, match="not a rate"):
        parse_rate("fast")


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["job", "create", "--bogus"]) == EXIT_USAGE
    assert main(["no-such-command"]) == EXIT_USAGE
    assert main(["agent", "serve", "--max-rate", "fast"]) == EXIT_USAGE
    assert main(["--help"]) == EXIT_OK


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out.strip() == f"relgate-agent, version {version('relgate-agent')}"


def test_keygen_build_verify_json_is_camel_case(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    priv, pub = tmp_path / "k.key", tmp_path / "builder-v1.pem"
    rc, out = _run(capsys, "--json", "keygen", "--private", str(priv), "--public", str(pub))
    assert rc == EXIT_OK and set(out) == {"keyid", "private", "public", "created"}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "a.bin").write_bytes(b"x" * 5000)
    env = tmp_path / "m.json"
    rc, out = _run(
        capsys,
        "manifest",
        "build",
        str(ckpt),
        "--json",
        "--model",
        "m",
        "--version",
        "v1",
        "--chunk-size",
        "4KiB",
        "--block-size",
        "1KiB",
        "--key",
        str(priv),
        "--out",
        str(env),
    )
    assert rc == EXIT_OK and out["chunks"] == 2 and out["totalSize"] == 5000
    digest = out["manifestDigest"]
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / "builder-v1.pem").write_bytes(pub.read_bytes())
    rc, out = _run(capsys, "--json", "manifest", "verify", str(env), "--trusted-keys", str(trusted))
    assert rc == EXIT_OK and out["manifestDigest"] == digest and out["model"] == "m"
    # a placed copy that is not there: rejected (exit 3), the check named
    rc, out = _run(
        capsys,
        "verify",
        "m",
        "v1",
        "--json",
        "--models-root",
        str(tmp_path / "models"),
        "--trusted-keys",
        str(trusted),
        str(trusted),
    )
    assert rc == EXIT_REJECTED and out["check"] == "not-placed" and out["error"] == "rejected"


def test_a_bad_envelope_is_rejected_with_its_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    rc, out = _run(capsys, "--json", "manifest", "verify", str(bad), "--trusted-keys", str(trusted))
    assert rc == EXIT_REJECTED and out["error"] == "rejected" and out["check"]
