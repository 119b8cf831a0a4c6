import sys

from relgate_agent.cli import main

sys.exit(main())
