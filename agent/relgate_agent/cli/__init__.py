"""relgate-agent command line (click): one module per command group.

Every command accepts ``--json`` and then prints exactly one JSON object (camelCase keys)
on stdout. Exit codes: 0 ok, 1 internal error, 2 usage, 3 rejected (validation or
verification, a coordinator refusal), 4 conflict.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

import click
import grpc

from relgate_agent.cli.ca import ca, hosts
from relgate_agent.cli.carotate import COMMANDS as _rotation_commands  # noqa: F401 - registers
from relgate_agent.cli.config import ConfigError
from relgate_agent.cli.daemons import agent, coordinator, pipes
from relgate_agent.cli.enroll import hosts_request as _enroll_commands  # noqa: F401 - registers
from relgate_agent.cli.jobctl import job
from relgate_agent.cli.manifests import keygen, manifest
from relgate_agent.cli.params import Output, common, expand_greedy_args
from relgate_agent.cli.scrub import verify
from relgate_agent.cli.serving import ack_serving
from relgate_agent.cli.simulate import simulate
from relgate_agent.cli.verify_handoff import verify_handoff
from relgate_agent.client import CoordinatorRefusal, sent_check
from relgate_agent.errors import AgentError

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_REJECTED, EXIT_CONFLICT = 0, 1, 2, 3, 4

_REJECTED_CODES = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
)
_CONFLICT_CODES = (grpc.StatusCode.ABORTED, grpc.StatusCode.ALREADY_EXISTS)


@click.group("relgate-agent", help=__doc__)
@click.version_option(package_name="relgate-agent", prog_name="relgate-agent")
@common
def cli() -> None:
    pass


_COMMANDS = (
    ca,
    hosts,
    keygen,
    manifest,
    verify,
    verify_handoff,
    ack_serving,
    coordinator,
    agent,
    job,
    pipes,
)
for _command in (*_COMMANDS, simulate):
    cli.add_command(_command)


def _rpc_exit(out: Output, exc: grpc.RpcError) -> int:
    code = exc.code()
    result: dict[str, object] = {"error": code.name.lower(), "message": exc.details()}
    check = sent_check(exc)
    if check:  # the rule that refused it, as the coordinator named it
        result["check"] = check
    out.emit(result)
    if code in _REJECTED_CODES:
        return EXIT_REJECTED
    if code in _CONFLICT_CODES:
        return EXIT_CONFLICT
    return EXIT_INTERNAL


def _check_of(exc: AgentError) -> str:
    """The check a refusal names: its own, else one derived from its type (never empty)."""
    check = getattr(exc, "check", "")
    if check:
        return str(check)
    name = re.sub(r"(?<!^)(?=[A-Z])", "-", type(exc).__name__).lower()
    return name.removesuffix("-error") or "refused"


def _refusal_exit(out: Output, exc: AgentError) -> int:
    """A verification failure, a coordinator refusal or another agent error: exit 3, with
    the check that refused it."""
    if isinstance(exc, CoordinatorRefusal | ConfigError):
        out.emit(exc.to_json())
    else:
        out.emit({"error": "rejected", "message": str(exc), "check": _check_of(exc)})
    return EXIT_REJECTED


def main(argv: Sequence[str] | None = None) -> int:
    out = Output()
    args = expand_greedy_args(sys.argv[1:] if argv is None else argv)
    try:
        rc = cli.main(args=args, prog_name="relgate-agent", standalone_mode=False, obj=out)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return EXIT_USAGE if isinstance(exc, click.UsageError) else EXIT_INTERNAL
    except click.exceptions.Abort:
        return EXIT_INTERNAL
    except grpc.RpcError as exc:
        return _rpc_exit(out, exc)
    except AgentError as exc:
        return _refusal_exit(out, exc)
    return int(rc) if isinstance(rc, int) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
