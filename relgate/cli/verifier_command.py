"""The standalone verifier command (``python -m relgate.release.verifier``).

Verifies a release (or only the named shards, without a state change) and prints one
JSON object; exit 0 when it passed, 3 when it did not, the error's exit code on a
refusal, 1 on an internal error.  Flags and output are those of the former argparse main.
"""

from __future__ import annotations

import json
import sys
import traceback

import click

from relgate.errors import RelgateError
from relgate.release.crypto import key_ring
from relgate.release.verifier import verify_release, verify_shards
from relgate.workspace import Workspace

_FAILED = 3


@click.command(
    "verifier",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("--home", default=None, help="RELGATE_HOME of the workspace")
@click.option("--root", "root", required=True, help="root manifest digest")
@click.option("--shard", "shards", multiple=True, help="verify only these ids")
@click.option("--workers", type=int, default=None)
@click.option("--key", "keys", multiple=True, help="keyVersion=path/to/key")
@click.option("--actor", default="verifier")
def verifier_command(
    home: str | None,
    root: str,
    shards: tuple[str, ...],
    workers: int | None,
    keys: tuple[str, ...],
    actor: str,
) -> None:
    """Verify a shard release from its signed root and exact object versions."""
    sys.exit(run(home, root, shards, workers, keys, actor))


def run(
    home: str | None,
    root: str,
    shards: tuple[str, ...],
    workers: int | None,
    keys: tuple[str, ...],
    actor: str,
) -> int:
    """The command's body: prints the JSON result, returns the exit code."""
    ws = Workspace.open(home)
    try:
        ring = key_ring(keys)
        if not shards:
            report = verify_release(ws, root, workers=workers, keys=ring, actor=actor)
            print(json.dumps(report.summary() | {"counts": report.counts}, sort_keys=True))
            return 0 if report.ok else _FAILED
        subset = verify_shards(ws, root, shards, workers=workers, keys=ring)
        print(json.dumps(subset.to_json(), sort_keys=True))
        return 0 if subset.ok else _FAILED
    except RelgateError as exc:
        print(json.dumps(exc.to_json(), sort_keys=True))
        return exc.exit_code
    except Exception:
        traceback.print_exc(file=sys.stderr)
        return 1
    finally:
        ws.close()


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns its exit code (usage errors exit 2, as before)."""
    try:
        verifier_command.main(args=argv, prog_name="python -m relgate.release.verifier")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
