"""The agent command line with faults: ``python -m relgate_lab.faulty_agent ARGS...``.

Installs the hooks RELGATE_AGENT_FAULT asks for (:mod:`relgate_lab.faults`), then runs the
normal ``relgate-agent`` command line with the same arguments and exit code.
"""

from __future__ import annotations

import sys

from relgate_agent import hooks
from relgate_agent.cli import main as agent_main
from relgate_lab.faults import hooks_from_env


def main(argv: list[str] | None = None) -> int:
    hooks.install(hooks_from_env())
    return agent_main(argv)


if __name__ == "__main__":
    sys.exit(main())
