"""`python -m petals_chain ...` runs the command line."""

import sys

from petals_chain.cli import main

sys.exit(main())
