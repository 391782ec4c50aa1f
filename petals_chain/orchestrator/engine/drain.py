"""Draining a server: move every session off it, then let it leave; recomposition happens only after.

``POST /servers/{name}/drain`` (and a ``petals_chain.server`` on SIGTERM, which asks for its own drain) stops offering
the server's chains, asks the lease manager for a slot elsewhere for every session on them (queued ahead of later
arrivals when none is free; :class:`~petals_chain.orchestrator.leasing.migration.MigratingLeaseManager`), and once no
session is left there, or after a bounded time, marks the server as left, which recomposes without it.
docs/migration.md, "Drain".

:class:`Drains` is handed what it acts on (the registry, the lease manager, and two callbacks of the engine: offer
again, and mark a server left), never the engine itself, so this module does not import the engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from petals_chain.orchestrator.leasing.leases import LeaseManager
from petals_chain.orchestrator.state.registry import Registry, check_name
from petals_chain.protocol.messages import DRAINED_REASON
from petals_chain.protocol.parsing import BadRequestError

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05


class Drains:
    """The servers being drained (their chains are not offered) and the tasks that finish each drain."""

    def __init__(self, registry: Registry, leases: LeaseManager, *, reoffer: Callable[[], None],
                 leave: Callable[[str, str], Awaitable[None]]) -> None:
        """``reoffer`` offers the ready chains again (a draining server's stop being ready); ``leave(name, reason)``
        marks a drained server as left and recomposes without it."""
        self.registry = registry
        self.leases = leases
        self._reoffer = reoffer
        self._leave = leave
        self.tasks: dict[str, asyncio.Task] = {}

    def __contains__(self, name: str) -> bool:
        """Whether ``name`` is being drained (or has been, and has not registered again)."""
        return name in self.tasks

    def __bool__(self) -> bool:
        return bool(self.tasks)

    def forget(self, name: str) -> None:
        """A server that comes back after a drain serves again."""
        self.tasks.pop(name, None)

    async def start(self, name: str, *, wait_s: float, timeout_s: float) -> dict[str, Any]:
        """Start draining ``name`` (idempotent) and wait at most ``wait_s`` for it to end; return its status."""
        rec = self.registry.get(check_name(name))
        leases = self.leases
        moves = leases.capabilities.moves_sessions
        if not moves or leases.packing:
            raise BadRequestError(f"field 'name' = {name!r}: this orchestrator's leases ({type(leases).__name__}, "
                                  f"policy {leases.migration if moves else None!r}) cannot be drained: a drain "
                                  "needs JFFC leases")
        if rec.alive and name not in self.tasks:
            self.tasks[name] = asyncio.current_task()  # placeholder until the task below exists: readiness sees it
            self._reoffer()  # its chains stop being offered; the sessions on them keep running
            leases.drain(name)
            self.tasks[name] = asyncio.create_task(self._finish(name, timeout_s))
            log.info("draining server %s: %d sessions to move", name, len(leases.leases_on(name)))
        task = self.tasks.get(name)
        if wait_s > 0 and task is not None and not task.done():
            await asyncio.wait({task}, timeout=wait_s)
        return self.status(name)

    def status(self, name: str) -> dict[str, Any]:
        """Whether ``name`` is draining, how many sessions are still on it, and whether it has left."""
        rec = self.registry.get(check_name(name))
        task = self.tasks.get(name)
        return {
            "server": name,
            "draining": task is not None and not task.done(),
            "sessions": len(self.leases.leases_on(name)) if self.leases.capabilities.moves_sessions else None,
            "left": not rec.alive,
            "reason": rec.dead_reason,
        }

    async def _finish(self, name: str, timeout_s: float) -> None:
        """Wait until no session runs through ``name`` (or ``timeout_s``), then mark it left and recompose."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.leases.leases_on(name) and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        stuck = len(self.leases.leases_on(name))
        if stuck:
            log.warning("drain of %s timed out after %g s with %d sessions still on it", name, timeout_s, stuck)
        reason = DRAINED_REASON if not stuck else f"{DRAINED_REASON} (timed out, {stuck} sessions left)"
        await self._leave(name, reason)
