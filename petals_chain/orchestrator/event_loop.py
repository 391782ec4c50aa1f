"""The event loop the orchestrator runs on: uvloop by default, asyncio's own on request.

uvloop (libuv underneath) takes less of the loop's time per request than asyncio's selector loop: the
orchestrator's lease + release round trip spends about a quarter of its CPU in the loop itself
(results/bench/orchestrator-profile.txt). `python -m petals_chain.bench orchestrator --loop asyncio uvloop`
measures both in the same run (docs/orchestrator.md, "Speed of a lease").
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

LOOPS = ("asyncio", "uvloop")
DEFAULT_LOOP = "uvloop"


def run(main: Coroutine[Any, Any, T], loop: str = DEFAULT_LOOP) -> T:
    """Run ``main`` to completion on a new event loop of kind ``loop`` (:data:`LOOPS`)."""
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
