"""What every ``relgate`` command shares: the workspace context, the typed command result and
the ``--json`` / exit-code wrapper (printing goes through :mod:`relgate.cli.output`)."""

from __future__ import annotations

import functools
import getpass
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import click

from relgate.cli.output import Payload, print_human, print_json, to_wire
from relgate.cli.progress_bars import progress_bars
from relgate.errors import RelgateError, UsageError

if TYPE_CHECKING:
    from relgate.integrity.signing import TrustedKeys
    from relgate.workspace import Workspace

#: Exit codes (DESIGN.md): 0 ok, 1 internal, 2 usage, 3 rejected, 4 conflict.
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_REJECTED = 3


@dataclass(frozen=True)
class CommandResult:
    """A command's printed object and its exit code (a refusal still prints its object)."""

    body: Payload
    exit_code: int = EXIT_OK
    #: what to print instead of the generic ``key: value`` lines without ``--json`` (a table)
    text: str | None = None

    @classmethod
    def of(cls, body: Payload, *, ok: bool) -> CommandResult:
        """``body`` with exit 0 when ``ok``, else exit 3 (rejected)."""
        return cls(body, EXIT_OK if ok else EXIT_REJECTED)

    @classmethod
    def rejected(
        cls,
        body: Payload,
        *,
        check: str,
        message: str,
        subject: str | None = None,
        digest: str | None = None,
    ) -> CommandResult:
        """``body`` plus the error fields every refusal carries (``subject`` is printed as
        ``object``, like a core error's); exit 3."""
        error: dict[str, object] = {"error": "rejected", "check": check, "message": message}
        if subject is not None:
            error["object"] = subject
        if digest is not None:
            error["digest"] = digest
        return cls({**to_wire(body), **error}, EXIT_REJECTED)


#: What a command function returns.
CommandOutput: TypeAlias = "Payload | CommandResult"


def as_object(value: Payload) -> dict[str, object]:
    """A core result as a mutable JSON object (a model through ``to_json()``), to extend."""
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return dict(to_json())
    return dict(value) if isinstance(value, Mapping) else {"value": value}


def actor() -> str:
    """Who runs this command (the login name; ``unknown`` if there is none)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry for the uid
        return "unknown"


def _fail(as_json: bool, body: Payload, text: str, code: int) -> None:
    if as_json:
        print_json(to_wire(body))
    click.echo(f"relgate: {text}", err=True)
    sys.exit(code)


def _emit(output: CommandOutput, as_json: bool) -> None:
    result = output if isinstance(output, CommandResult) else CommandResult(output)
    wire = to_wire(result.body)
    if as_json:
        print_json(wire)
    elif result.text is not None:
        click.echo(result.text)
    else:
        print_human(wire)
    sys.exit(result.exit_code)


#: The largest magnitude an integer option may have: JSON's interoperable range, which
#: also fits every catalog column (SQLite and PostgreSQL BIGINT).
MAX_OPTION_INT = 2**53 - 1


def _refuse_hostile_values(kw: Mapping[str, object]) -> None:
    """Every string argument passes the identifier rule's character part (exit 3,
    ``check=identifier``): a name with a terminal escape or a control character is refused
    here, before anything stores or prints it.  An integer beyond JSON's interoperable
    range is a usage error (exit 2, ``check=integer-range``).  Both name the option."""
    from relgate.integrity.identifiers import validate_text

    params = {p.name: p for p in click.get_current_context().command.params}
    for name, value in kw.items():
        param = params.get(name)
        where = param.opts[0] if isinstance(param, click.Option) else (name or "argument").upper()
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, str):
                validate_text(item, kind=f"value of {where}", where=where)
            elif (
                isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_OPTION_INT
            ):
                raise UsageError(
                    f"{where} is out of range (at most {MAX_OPTION_INT} in magnitude)",
                    object=where,
                    check="integer-range",
                )


def _typed(exc: Exception) -> RelgateError | None:
    """A database failure outside the catalog's transactions (a lost connection, the wrong
    database) as the typed error it means; ``None`` for anything else."""
    if not type(exc).__module__.startswith("sqlalchemy"):
        return None
    from relgate.catalog.db import catalog_error

    return catalog_error(exc)


def command(
    group: click.Group, name: str, **kwargs: object
) -> Callable[[Callable[..., CommandOutput]], click.Command]:
    """Register a command returning a :data:`CommandOutput`; adds ``--json``, maps errors to
    exit codes and prints exactly one object."""

    def wrap(fn: Callable[..., CommandOutput]) -> click.Command:
        @functools.wraps(fn)
        def run(*args: object, as_json: bool, **kw: object) -> None:
            try:
                _refuse_hostile_values(kw)
                with progress_bars(as_json):
                    output = fn(*args, **kw)
            except RelgateError as exc:
                _fail(as_json, exc.to_json(), str(exc), exc.exit_code)
                return
            except click.ClickException:
                raise
            except Exception as exc:
                typed = _typed(exc)
                if typed is not None:
                    _fail(as_json, typed.to_json(), str(typed), typed.exit_code)
                    return
                text = f"{type(exc).__name__}: {exc}"
                _fail(
                    as_json,
                    {"error": "internal", "message": text},
                    f"internal error: {text}",
                    EXIT_INTERNAL,
                )
                return
            _emit(output, as_json)

        decorated = click.option(
            "--json", "as_json", is_flag=True, help="Print one JSON object on stdout."
        )(run)
        return group.command(name, **kwargs)(decorated)

    return wrap


class Ctx:
    """The ``--home`` the command was given; the workspace is opened on first use."""

    def __init__(self, home: str | None) -> None:
        self.home = home

    def ws(self) -> Workspace:
        from relgate.workspace import Workspace

        return Workspace.open(self.home)


pass_ctx = click.make_pass_decorator(Ctx)

TRUSTED_HELP = (
    "PEM public key, directory of keys, or ROLE=PATH (default: the workspace's trusted keys). "
    "Role and version come from file names <role>-v<N>-*.pem."
)


def trusted_keys(ctx: Ctx, entries: tuple[str, ...]) -> TrustedKeys:
    """--trusted-key entries (PEM file, directory, or ROLE=PATH), else the workspace's keys."""
    from relgate.integrity.signing import load_trusted

    for entry in entries:
        path = entry.partition("=")[2] if "=" in entry else entry
        if not Path(path).exists():
            raise UsageError("trusted key path does not exist", object=entry, check="trusted-keys")
    return load_trusted(entries) if entries else ctx.ws().trusted_keys
