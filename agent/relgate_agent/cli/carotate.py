"""CA rotation commands: ``ca status|rotate|promote|retire`` (docs/agent-ca-rotation.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from relgate_agent.cli.ca import ca
from relgate_agent.cli.params import common, output

if TYPE_CHECKING:
    from relgate_agent.identity.carotation import RotationState

NEXT_STEP = {
    "single": "rotate (when the time comes)",
    "rotated": "wait one trust poll, then promote",
    "overlap": "wait until every host renewed, reissue coordinator and operator"
    " certificates, then retire",
}


def _emit(directory: str, step: Callable[[Path], RotationState]) -> None:
    now = step(Path(directory))
    output().emit(
        {
            "dir": directory,
            "step": now.step,
            "signer": now.signer,
            "trusted": list(now.trusted),
            "pending": now.pending,
            "next": NEXT_STEP[now.step],
        }
    )


# (command, the carotation function it runs, help)
STEPS = (
    ("status", "state", "the CA directory's rotation step, signer and trusted CAs"),
    ("rotate", "rotate", "make the next CA and trust it beside the signing one"),
    ("promote", "promote", "the rotated CA signs from now on; hosts renew onto it"),
    ("retire", "retire", "trust the signing CA only: the old CA's certificates are refused"),
)


def _step_command(name: str, function: str, help_text: str) -> click.Command:
    @ca.command(name, help=help_text)
    @common
    @click.option("--dir", "directory", required=True, help="the CA directory")
    def step(directory: str) -> None:
        from relgate_agent.identity import carotation

        _emit(directory, getattr(carotation, function))

    return step


COMMANDS = [_step_command(*s) for s in STEPS]
