"""Benchmarks, one module per subcommand: ``python -m petals_chain.bench <name>``, names in SUBCOMMANDS.

Each module named in :data:`SUBCOMMANDS` defines ``run(argv: list[str] | None) -> int``;
add a subcommand by adding its module here. Modules load lazily, so one
subcommand's imports never slow down or break another.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

SUBCOMMANDS: dict[str, str] = {
    "sim": "petals_chain.bench.sim",
    "compose": "petals_chain.bench.compose",
    "swarm": "petals_chain.bench.swarm",
    "orchestrator": "petals_chain.bench.orchestrator",
    "orchestrator-profile": "petals_chain.bench.orchestrator_profile",
    "moldable": "petals_chain.bench.moldable",
    "mell": "petals_chain.bench.mell",
    "torta": "petals_chain.bench.torta",
    "server-step": "petals_chain.bench.server_step",
    "server": "petals_chain.bench.server",
    "server-prefill": "petals_chain.bench.server_prefill",
    "ab": "petals_chain.bench.ab",
}


def load(name: str) -> Callable[[list[str] | None], int]:
    """The ``run`` function of subcommand ``name``; ValueError for an unknown or not-yet-written one."""
    if name not in SUBCOMMANDS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {', '.join(SUBCOMMANDS)}")
    try:
        module = importlib.import_module(SUBCOMMANDS[name])
    except ModuleNotFoundError as exc:
        if exc.name == SUBCOMMANDS[name]:
            raise ValueError(f"benchmark {name!r} is not available yet ({SUBCOMMANDS[name]} is missing)") from None
        raise
    return module.run
