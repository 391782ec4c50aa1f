"""Draining a server: move every session off it, then let it leave; recomposition happens only after.

``POST /servers/{name}/drain`` (and a ``petals_chain.server`` on SIGTERM, which asks for its own drain) stops offering
the server's chains, asks the lease manager for a slot elsewhere for every session on them (queued ahead of later
arrivals when none is free; :class:`~petals_chain.orchestrator.migration.MigratingLeaseManager`), and once no
session is left there, or after a bounded time, marks the server as left, which recomposes without it.
docs/migration.md, "Drain".
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from petals_chain.orchestrator.registry import check_name
from petals_chain.protocol.messages import DRAINED_REASON
from petals_chain.protocol.parsing import BadRequestError

if TYPE_CHECKING:
    from petals_chain.orchestrator.core import Orchestrator

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05


async def drain_server(orch: Orchestrator, name: str, *, wait_s: float, timeout_s: float) -> dict[str, Any]:
    """Start draining ``name`` (idempotent) and wait at most ``wait_s`` for it to end; return its status."""
    rec = orch.registry.get(check_name(name))
    moves = orch.leases.capabilities.moves_sessions
    if not moves or orch.leases.packing:
        raise BadRequestError(f"field 'name' = {name!r}: this orchestrator's leases ({type(orch.leases).__name__}, "
                              f"policy {orch.leases.migration if moves else None!r}) cannot be drained: a drain "
                              "needs JFFC leases")
    if rec.alive and name not in orch.draining:
        orch.draining[name] = asyncio.current_task()  # placeholder until the task below exists: _ready sees it
        orch._offer()  # its chains stop being offered; the sessions on them keep running
        orch.leases.drain(name)
        orch.draining[name] = asyncio.create_task(_finish(orch, name, timeout_s))
        log.info("draining server %s: %d sessions to move", name, len(orch.leases.leases_on(name)))
    task = orch.draining.get(name)
    if wait_s > 0 and task is not None and not task.done():
        await asyncio.wait({task}, timeout=wait_s)
    return drain_status(orch, name)


def drain_status(orch: Orchestrator, name: str) -> dict[str, Any]:
    """Whether ``name`` is draining, how many sessions are still on it, and whether it has left."""
    rec = orch.registry.get(check_name(name))
    task = orch.draining.get(name)
    return {
        "server": name,
        "draining": task is not None and not task.done(),
        "sessions": len(orch.leases.leases_on(name)) if orch.leases.capabilities.moves_sessions else None,
        "left": not rec.alive,
        "reason": rec.dead_reason,
    }


async def _finish(orch: Orchestrator, name: str, timeout_s: float) -> None:
    """Wait until no session runs through ``name`` (or ``timeout_s``), then mark it left and recompose."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while orch.leases.leases_on(name) and loop.time() < deadline:
        await asyncio.sleep(DRAIN_POLL_S)
    stuck = len(orch.leases.leases_on(name))
    if stuck:
        log.warning("drain of %s timed out after %g s with %d sessions still on it", name, timeout_s, stuck)
    reason = DRAINED_REASON if not stuck else f"{DRAINED_REASON} (timed out, {stuck} sessions left)"
    await orch.server_failed(name, reason)
