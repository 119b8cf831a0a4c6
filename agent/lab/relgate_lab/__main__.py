import sys

from relgate_lab.commands import main

sys.exit(main())
