"""``python -m relgate`` is the ``relgate`` command."""

from relgate.cli import main

main()
