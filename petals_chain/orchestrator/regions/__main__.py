"""``python -m petals_chain.orchestrator.regions``: see :mod:`petals_chain.orchestrator.regions.cli`."""

import sys

from petals_chain.orchestrator.regions.cli import main

sys.exit(main())
