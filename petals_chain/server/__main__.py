"""``python -m petals_chain.server``: see :mod:`petals_chain.server.cli`."""

import sys

from petals_chain.server.cli import main

sys.exit(main())
