"""``python -m petals_chain.orchestrator``: see :mod:`petals_chain.orchestrator.cli`."""

import sys

from petals_chain.orchestrator.cli import main

sys.exit(main())
