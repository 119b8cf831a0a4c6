"""The ``verify`` command: scrub a placed copy against its signed manifest."""

from __future__ import annotations

from pathlib import Path

import click

from relgate_agent.cli.params import common, output

EXIT_OK, EXIT_REJECTED = 0, 3


@click.command(
    "verify", help="scrub a placed copy against its signed manifest; un-place on mismatch"
)
@common
@click.argument("model")
@click.argument("version")
@click.option("--models-root", default="/models")
@click.option("--trusted-keys", required=True, multiple=True)
@click.option("--keep", is_flag=True, help="report a mismatch but do not un-place")
def verify(
    model: str, version: str, models_root: str, trusted_keys: tuple[str, ...], keep: bool
) -> int:
    """Scrub a placed copy against its signed manifest; un-place it on any mismatch."""
    from relgate_trust.manifest import TrustedKeys

    from relgate_agent.staging.reverify import reverify_placed

    trusted = TrustedKeys.load(list(trusted_keys))
    result = reverify_placed(Path(models_root), model, version, trusted, keep=keep)
    output().emit(result.to_json())
    return EXIT_OK if result.intact else EXIT_REJECTED
