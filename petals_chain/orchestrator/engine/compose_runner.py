"""Where the orchestrator runs a full recomposition: a thread for a small swarm, a worker process for a large one.

At J = 1000 the default composition takes about half a second of CPU, mostly in numba kernels that hold the GIL; in
a thread of the orchestrator's process that would stall the event loop, and with it every lease, for as long. A
worker process shares no GIL with the API. Starting one costs a second or two and some memory, worth it only where
a recomposition is slow: ``mode="auto"`` picks the process from ``defaults.COMPOSE_PROCESS_MIN_SERVERS`` live servers
on. A composer that cannot be sent to another process (a lambda in a test) runs in a thread, with a warning.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import pickle
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from petals_chain import defaults
from petals_chain.model import Composition, ModelSpec, ServerSpec
from petals_chain.orchestrator.engine.composition import CompositionPolicy

log = logging.getLogger(__name__)

COMPOSE_IN = ("auto", "thread", "process")


class ComposeRunner:
    """Runs ``policy.try_compose`` off the event loop, in a thread or in one worker process (started on first use)."""

    def __init__(self, mode: str = "auto", min_servers: int = defaults.COMPOSE_PROCESS_MIN_SERVERS) -> None:
        if mode not in COMPOSE_IN:
            raise ValueError(f"compose_in must be one of {', '.join(COMPOSE_IN)}, got {mode!r}")
        self.mode = mode
        self.min_servers = min_servers
        self._pool: ProcessPoolExecutor | None = None
        self._unpicklable = False
        self.runs = {"thread": 0, "process": 0}

    def where(self, servers: int) -> str:
        """``thread`` or ``process`` for a recomposition of ``servers`` live servers."""
        if self.mode == "auto":
            return "process" if servers >= self.min_servers and not self._unpicklable else "thread"
        return "thread" if self._unpicklable else self.mode

    async def compose(self, policy: CompositionPolicy, specs: Sequence[ServerSpec],
                      model: ModelSpec) -> tuple[Composition | None, str | None]:
        """``policy.try_compose(specs, model)``, computed where :meth:`where` says."""
        loop = asyncio.get_running_loop()
        if self.where(len(specs)) == "process":
            try:
                pickle.dumps(policy)
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                log.warning("composition policy cannot go to a worker process (%s): composing in a thread", exc)
                self._unpicklable = True
            else:
                if self._pool is None:
                    self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
                self.runs["process"] += 1
                return await loop.run_in_executor(self._pool, policy.try_compose, tuple(specs), model)
        self.runs["thread"] += 1
        return await loop.run_in_executor(None, policy.try_compose, specs, model)

    def close(self) -> None:
        """Stop the worker process, if one was started (a recomposition in flight is abandoned)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
