"""What every relgate command shares: the --json/exit-code wrapper and the workspace context."""

from __future__ import annotations

import functools
import getpass
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from relgate.errors import RelgateError


def _actor() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def _print_human(value: Any, indent: int = 0) -> None:
    pad = "  " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                click.echo(f"{pad}{key}:")
                _print_human(item, indent + 1)
            else:
                click.echo(f"{pad}{key}: {item}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                click.echo(f"{pad}-")
                _print_human(item, indent + 1)
            else:
                click.echo(f"{pad}- {item}")
    else:
        click.echo(f"{pad}{value}")


def command(
    group: click.Group, name: str, **kwargs: Any
) -> Callable[[Callable[..., dict[str, Any]]], click.Command]:
    """Register a command that returns a dict; handles --json, errors and exit codes."""

    def wrap(fn: Callable[..., dict[str, Any]]) -> click.Command:
        @functools.wraps(fn)
        def run(*args: Any, as_json: bool, **kw: Any) -> None:
            try:
                result = fn(*args, **kw)
            except RelgateError as exc:
                if as_json:
                    click.echo(json.dumps(exc.to_json(), sort_keys=True))
                click.echo(f"relgate: {exc}", err=True)
                sys.exit(exc.exit_code)
            except click.ClickException:
                raise
            except Exception as exc:
                error = {"error": "internal", "message": f"{type(exc).__name__}: {exc}"}
                if as_json:
                    click.echo(json.dumps(error, sort_keys=True))
                click.echo(f"relgate: internal error: {type(exc).__name__}: {exc}", err=True)
                sys.exit(1)
            ok = bool(result.pop("_ok", True))
            code = int(result.pop("_exit", 0 if ok else 3))
            if as_json:
                click.echo(json.dumps(result, sort_keys=True, default=str))
            else:
                _print_human(result)
            sys.exit(code)

        run = click.option(
            "--json", "as_json", is_flag=True, help="Print one JSON object on stdout."
        )(run)
        return group.command(name, **kwargs)(run)

    return wrap


class Ctx:
    def __init__(self, home: str | None) -> None:
        self.home = home

    def ws(self) -> Any:
        from relgate.workspace import Workspace

        return Workspace.open(self.home)


pass_ctx = click.make_pass_decorator(Ctx)
