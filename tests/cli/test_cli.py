"""The relgate CLI as users run it: real processes, one JSON object, DESIGN.md exit codes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relgate.cli.output import DATA_MAPS, VERBATIM

RELGATE = [sys.executable, "-m", "relgate.cli"]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "home"
    run(path, "init")
    run(path, "demo", "seed", "--tickets", "80")
    return path


def run(home: Path, *args: str, expect: int = 0) -> dict:
    proc = subprocess.run(
        [*RELGATE, "--home", str(home), *args, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "RELGATE_HASH_WORKERS": "1"},
    )
    assert proc.returncode == expect, (args, proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout  # exactly one JSON object
    return json.loads(lines[0])


def _snake_keys(value: object, path: str = "$") -> list[str]:
    """Object keys with an underscore, outside maps keyed by data and stored documents."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if "_" in key:
                found.append(f"{path}.{key}")
            if key in VERBATIM:
                continue
            if key in DATA_MAPS and isinstance(item, dict):
                for inner in item.values():
                    found += _snake_keys(inner, f"{path}.{key}.*")
            else:
                found += _snake_keys(item, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            found += _snake_keys(item, f"{path}[]")
    return found


def test_version_and_shell_completion():
    """``--version`` prints the installed distribution's version; click's completion script
    (docs: README) is there for bash."""
    from importlib.metadata import version

    shown = subprocess.run([*RELGATE, "--version"], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == f"relgate, version {version('relgate')}"
    script = subprocess.run(
        [sys.executable, "-c", "from relgate.cli.main import main; main(prog_name='relgate')"],
        capture_output=True,
        text=True,
        env={**os.environ, "_RELGATE_COMPLETE": "bash_source"},
    )
    assert "_relgate_completion" in script.stdout


def test_every_json_object_uses_camel_case_keys(home):
    """`snapshot show` used to mix member_count with fenceHits; catalog rows are camelCase now."""
    digest = run(home, "snapshot", "build", "--alias", "camel")["snapshot"]
    run(home, "snapshot", "approve", digest, "--approver", "carol")
    run(home, "snapshot", "activate", digest, "--alias", "camel")
    shown = run(home, "snapshot", "show", digest)
    assert shown["memberCount"] > 0 and shown["fenceHits"] == []
    assert {"fromState", "toState"} <= set(shown["history"][0])
    assert shown["latestReport"]["subjectKind"] == "snapshot"
    outputs = {
        "snapshot show": shown,
        "snapshot list": run(home, "snapshot", "list"),
        "alias show": run(home, "alias", "show", "camel"),
        "key list": run(home, "key", "list"),
        "fence show": run(home, "fence", "show"),
        "release list": run(home, "release", "list"),
    }
    assert outputs["snapshot list"]["snapshots"][0]["createdAt"]
    assert {name: _snake_keys(doc) for name, doc in outputs.items()} == {n: [] for n in outputs}


def test_full_flow_and_exit_codes(home, tmp_path):
    built = run(home, "snapshot", "build", "--alias", "cli")
    digest = built["snapshot"]
    assert built["state"] == "VALIDATED"
    shown = run(home, "snapshot", "show", digest[7:19])  # a unique hex prefix resolves
    assert shown["digest"] == digest and shown["state"] == "VALIDATED"
    assert run(home, "snapshot", "activate", digest, "--alias", "cli", expect=3)["check"] == "state"
    run(home, "snapshot", "approve", digest, "--approver", "alice")
    assert (
        run(home, "snapshot", "activate", digest, "--alias", "cli", "--expect-generation", "0")[
            "generation"
        ]
        == 1
    )
    assert (
        run(home, "snapshot", "activate", digest, "--alias", "cli", "--expect-generation", "0")[
            "idempotentRetry"
        ]
        is True
    )
    # A second candidate racing on a stale generation loses the CAS: exit 4.
    second = run(home, "snapshot", "build", "--alias", "cli")["snapshot"]
    run(home, "snapshot", "approve", second, "--approver", "bob")
    conflict = run(
        home, "snapshot", "activate", second, "--alias", "cli", "--expect-generation", "0", expect=4
    )
    assert (
        conflict["error"] == "conflict"
        and conflict["check"] == "alias-generation"
        and conflict["digest"] == second
    )
    alias = run(home, "alias", "show", "cli")
    assert alias["activeDigest"] == digest and alias["generation"] == 1
    proof = run(home, "prove", "forum/0000001", "--snapshot", digest)
    proof_file = tmp_path / "proof.json"
    proof_file.write_text(json.dumps(proof))
    assert run(home, "check-proof", str(proof_file))["valid"] is True
    diff = run(home, "snapshot", "diff", digest, second)
    assert diff["additions"] == diff["deletions"] == 0
    assert run(home, "snapshot", "replay", digest, "--canary-bp", "5000")["result"] == "REPRODUCED"
    fence = run(home, "fence", "tombstone", "add", "forum/0000001", "--reason", "gdpr erasure")
    assert fence["watermark"] == 1 and digest in fence["hits"]
    assert run(home, "fence", "show")["tombstoneWatermark"] == 1
    refused = run(home, "snapshot", "activate", second, "--alias", "cli", expect=4)
    assert refused["check"] == "fence-watermarks"


def test_verify_manifest(home, tmp_path):
    digest = run(home, "snapshot", "build", "--no-validate")["snapshot"]
    hexd = digest.split(":")[1]
    store = home / "objects" / "keys"
    env_dir = next(p for p in store.iterdir() if hexd in p.name)
    envelope = json.loads((env_dir / "000000000001" / "data").read_text())
    good = tmp_path / "good.json"
    good.write_text(json.dumps(envelope))
    assert run(home, "verify-manifest", str(good))["snapshot"] == digest
    other_key = tmp_path / "other"
    other_key.mkdir()
    from relgate.integrity.signing import SigningKey

    (other_key / "k.pem").write_bytes(SigningKey.generate().public_pem())
    unknown = run(home, "verify-manifest", str(good), "--trusted-key", str(other_key), expect=3)
    assert unknown["check"] == "signature-trusted"
    envelope["signatures"] = []
    unsigned = tmp_path / "unsigned.json"
    unsigned.write_text(json.dumps(envelope))
    assert run(home, "verify-manifest", str(unsigned), expect=3)["check"] == "signature-present"


def test_usage_errors_exit_2(home):
    assert run(home, "snapshot", "show", "xyz", expect=2)["check"] == "digest-syntax"
    assert (
        run(home, "fence", "benchmark", "add", "not-a-digest", "--benchmark", "b", expect=2)[
            "error"
        ]
        == "usage"
    )
    proc = subprocess.run(
        [*RELGATE, "--home", str(home), "snapshot", "approve"], capture_output=True, text=True
    )
    assert proc.returncode == 2  # click's own usage errors keep the contract


def test_missing_workspace_is_a_usage_error(tmp_path):
    assert run(tmp_path / "nowhere", "snapshot", "list", expect=2)["check"] == "workspace-exists"
