"""`python -m speclm` runs the command line."""

import sys

from speclm.cli import main

sys.exit(main())
