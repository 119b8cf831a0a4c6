"""``python -m relgate.cli`` is the ``relgate`` command."""

from relgate.cli.main import main

main()
