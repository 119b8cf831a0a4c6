"""The CLI's output layer: one JSON style (camelCase keys) for dicts and models, typed results."""

import json

import click
from click.testing import CliRunner

from relgate.checkpoint.listing import CheckpointEntry
from relgate.cli.common import CommandResult, command
from relgate.cli.output import camel, to_wire
from relgate.errors import ConflictError


def test_camel_renames_snake_case_only():
    assert camel("bytes_moved") == "bytesMoved"
    assert camel("hosts_total") == "hostsTotal"
    assert camel("member_count") == "memberCount"
    for unchanged in ("memberCount", "fenceHits", "digest", "checkpoint-name", "tickets-eu", "_ok"):
        assert camel(unchanged) == unchanged


def test_dicts_and_models_print_camel_case_at_any_depth():
    entry = CheckpointEntry(model="m", version="v1", manifest_digest="sha256:ab", manifest_uri="u")
    wire = to_wire(
        {
            "member_count": 3,
            "status": {"bytes_moved": 7, "stragglers": [{"host_id": "h"}]},
            "checkpoints": [entry],
        }
    )
    assert wire == {
        "memberCount": 3,
        "status": {"bytesMoved": 7, "stragglers": [{"hostId": "h"}]},
        "checkpoints": [
            {"model": "m", "version": "v1", "manifestDigest": "sha256:ab", "manifestUri": "u"}
        ],
    }
    assert to_wire(entry) == entry.to_json()


def test_data_keys_and_stored_documents_keep_their_keys():
    wire = to_wire(
        {
            "by_source": {"eu_tickets": {"old_count": 1}},
            "manifest": {"member_tuple_root": "sha256:00"},
            "pin": {"position": {"data_pass": 0, "shard_cursor": 2}},
        }
    )
    # the map keyed by source id keeps the id, the fields inside are renamed
    assert wire["bySource"] == {"eu_tickets": {"oldCount": 1}}
    # a signed manifest body and a saved reader position are shown as stored
    assert wire["manifest"] == {"member_tuple_root": "sha256:00"}
    assert wire["pin"] == {"position": {"data_pass": 0, "shard_cursor": 2}}


def _run(fn, *args: str) -> tuple[int, dict]:
    group = click.Group()
    command(group, "x")(fn)
    out = CliRunner().invoke(group, ["x", *args, "--json"])
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, out.stdout
    return out.exit_code, json.loads(lines[0])


def test_command_results_carry_the_exit_code_not_magic_keys():
    def ok() -> CommandResult:
        return CommandResult.of({"report_digest": "sha256:aa"}, ok=True)

    def refused() -> CommandResult:
        return CommandResult.rejected(
            CheckpointEntry(model="m", version="v1", manifest_digest="d", manifest_uri="u"),
            check="distribution-complete",
            message="no event",
            subject="m/v1",
        )

    def conflict() -> dict:
        raise ConflictError("lost", object="alias", check="alias-generation", digest="sha256:01")

    assert _run(ok) == (0, {"reportDigest": "sha256:aa"})
    code, body = _run(refused)
    assert code == 3
    assert body["error"] == "rejected" and body["check"] == "distribution-complete"
    assert body["object"] == "m/v1" and body["manifestDigest"] == "d"
    assert _run(conflict) == (
        4,
        {
            "error": "conflict",
            "message": "lost",
            "object": "alias",
            "check": "alias-generation",
            "digest": "sha256:01",
        },
    )


def test_the_human_form_is_a_tree_with_whole_values_and_no_markup():
    digest = "sha256:" + "ab" * 32

    def nested() -> dict:
        return {
            "alias": "default",
            "keys": {"builder": digest, "note": "[bold]not markup[/bold]"},
            "shards": [{"id": "s0", "bytes": 7}, "loose"],
            "empty": [],
        }

    group = click.Group()
    command(group, "x")(nested)
    out = CliRunner().invoke(group, ["x"])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0] == "alias: default"
    assert lines[1] == "keys:"
    assert lines[2].endswith(f"builder: {digest}")  # a digest is never cut or wrapped
    assert lines[3].endswith("note: [bold]not markup[/bold]")
    assert any(line.endswith("id: s0") for line in lines)
    assert any(line.endswith("- loose") for line in lines)
    assert lines[-1] == "empty: []"
