"""One training rank as a Dagster Pipes child: ``python -m pipelines.rank_pipes``.

``pinned_run`` starts one per rank through ``PipesSubprocessClient``; the Pipes extras name
the run, the rank and the barrier timeout.  The child runs ``relgate run worker ... --json``
(the same click command, in this process), logs its result into the Dagster run, reports it
as a custom message (``RankResult``) and exits with the command's exit code (3 on a
refusal), so the client raises on any rank that did not pass the barrier.
"""

import contextlib
import io
import json
import sys

import click
from dagster_pipes import open_dagster_pipes

from relgate.cli.main import main as relgate_cli

#: The worker prints one JSON object; more than this is not one and is cut.
MAX_OUTPUT = 1 << 20


def _worker(argv: list[str]) -> tuple[int, str]:
    """Run the worker command; (exit code, what it printed on stdout)."""
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            returned = relgate_cli.main(args=argv, prog_name="relgate", standalone_mode=False)
            code = returned if isinstance(returned, int) else 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except click.ClickException as exc:
            exc.show()
            code = exc.exit_code
    return code, out.getvalue()[:MAX_OUTPUT].strip()


def main() -> int:
    with open_dagster_pipes() as pipes:
        extras = pipes.extras
        rank = int(str(extras["rank"]))
        argv = [
            "run",
            "worker",
            "--run",
            str(extras["run"]),
            "--rank",
            str(rank),
            "--barrier-timeout",
            str(float(str(extras["barrier_timeout"]))),
            "--json",
        ]
        code, text = _worker(argv)
        try:
            result = json.loads(text) if text else {}
        except ValueError:
            result = {"output": text[:500]}
        pipes.log.info(f"rank {rank} exit {code}: {text[:2000]}")
        pipes.report_custom_message({"rank": rank, "exitCode": code, "result": result})
    return code


if __name__ == "__main__":
    sys.exit(main())
