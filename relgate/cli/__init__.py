"""The ``relgate`` command line: one module per command group, all on click."""

from relgate.cli.main import main

__all__ = ["main"]
