"""Holding an orchestrator lease from the client: how sessions lease (LeaseOptions) and who renews and releases one
lease (LeaseKeeper)."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

from petals_chain import defaults
from petals_chain.model import SpecError
from petals_chain.orchestrator.blocking import BlockingOrchestrator
from petals_chain.orchestrator.client import LeaseInfo, OrchestratorError

log = logging.getLogger(__name__)


@dataclass
class LeaseOptions:
    """How sessions lease: wait at most timeout_s in the queue, TTL of a lease, a label for the orchestrator."""

    timeout_s: float = defaults.LEASE_WAIT_S
    ttl_s: float = defaults.LEASE_TTL_S
    client: str | None = None
    max_failovers: int = 8  # per step: more failed chains than this and the step raises FailoverError
    reload_wait_s: float = 120.0  # how long a session waits for a server of its chain to finish loading its span

    def __post_init__(self) -> None:
        for name in ("timeout_s", "ttl_s", "reload_wait_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0):
                raise SpecError(f"lease option '{name}' must be > 0 seconds, got {v!r}")
        if not (isinstance(self.max_failovers, int) and self.max_failovers >= 0):
            raise SpecError(f"lease option 'max_failovers' must be an integer >= 0, got {self.max_failovers!r}")


class LeaseKeeper:
    """Holds one lease: renews it every ttl/3 on the orchestrator loop, releases it exactly once."""

    def __init__(self, orch: BlockingOrchestrator, info: LeaseInfo, ttl_s: float) -> None:
        self.orch = orch
        self.info = info
        self.ttl_s = ttl_s
        self._released = False
        self._lock = threading.Lock()
        self._renewer = orch.spawn(self._renew_loop())

    def stop(self) -> None:
        """Stop renewing without releasing: the orchestrator already ended this lease (reported failure)."""
        with self._lock:
            self._released = True
        self._renewer.cancel()

    async def _renew_loop(self) -> None:
        """Renew until cancelled; a failed renewal is logged (the lease may then expire)."""
        client = await self.orch._get_client()
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await client.renew(self.info.lease_id)
            except OrchestratorError as exc:
                log.warning("lease %s could not be renewed: %s", self.info.lease_id, exc.message)
                return
            except Exception as exc:  # orchestrator briefly unreachable: try again next period
                log.warning("renewing lease %s failed: %s", self.info.lease_id, exc)

    def release(self) -> None:
        """Stop renewing and give the slot back (idempotent; an expired lease is not an error)."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._renewer.cancel()

        try:
            self.orch.run(lambda c: c.release(self.info.lease_id),  # retried while the orchestrator restarts
                          timeout_s=defaults.CALL_TIMEOUT_S + defaults.UNREACHABLE_WAIT_S)
        except OrchestratorError as exc:
            if exc.status != 404:  # 404: expired or already released
                log.warning("releasing lease %s: %s", self.info.lease_id, exc.message)
        except Exception as exc:  # unreachable: the lease expires after its TTL
            log.warning("releasing lease %s failed (%s); it will expire after %g s", self.info.lease_id, exc,
                        self.ttl_s)
