"""``python -m parsearch`` runs the command-line interface."""

import sys

from parsearch.cli import main

sys.exit(main())
