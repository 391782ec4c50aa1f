"""``python -m petals_chain.server``: see :mod:`petals_chain.server.cli`."""

from petals_chain.server.cli import exit_now, main

exit_now(main())
