"""`python -m tracker.cli`: the `draftboard` command, as child processes and launchers start it."""

import sys

from tracker.cli import main

sys.exit(main())
