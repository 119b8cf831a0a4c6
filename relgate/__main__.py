"""``python -m relgate`` is the ``relgate`` command."""

from relgate.cli.main import main

main()
