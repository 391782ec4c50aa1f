"""Holding an orchestrator lease from the client: how sessions lease (LeaseOptions) and who renews and releases one
lease (LeaseKeeper)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import math
import threading
import time
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, field_validator

from petals_chain import defaults
from petals_chain.declared import Declared, one_of, real
from petals_chain.mell.hybrid import RULES, Speeds
from petals_chain.model import SpecError
from petals_chain.moldable.width_range import check_width
from petals_chain.protocol.blocking import BlockingOrchestrator
from petals_chain.protocol.http_client import OrchestratorError
from petals_chain.protocol.replies import LeaseInfo

log = logging.getLogger(__name__)


class LeaseOptions(Declared):
    """How sessions lease: wait at most timeout_s in the queue, TTL of a lease, a label for the orchestrator."""

    OWNER: ClassVar[str] = "lease option"

    timeout_s: float = defaults.LEASE_WAIT_S
    """How long a lease request waits in the orchestrator's queue."""
    ttl_s: float = defaults.LEASE_TTL_S
    """A lease's time to live; the keeper renews it every ttl/3."""
    client: str | None = None
    """A label the orchestrator shows for this client's leases."""
    max_failovers: int = 8
    """Per step: more failed chains than this and the step raises FailoverError."""
    reload_wait_s: float = 120.0
    """How long a session waits for a server of its chain to finish loading its span."""
    move_check_s: float = 0.5
    """At a step boundary, ask whether to move (a renew) when the last ask is this old."""
    move_link_bytes: float = math.inf
    """Per move, bytes of KV cache the link may carry (0: never KV transfer)."""
    move_prefill_tokens: int = 1 << 30
    """Per move, tokens the new chain may re-prefill (0: never token replay)."""
    move_rule: str = "fastest"
    """How a move's mode is picked among those within budget (mell.hybrid.RULES)."""
    move_speeds: Any = Field(default_factory=Speeds)
    """The profile the 'fastest' rule estimates times from (a mell.hybrid.Speeds)."""
    k_max: int | None = None
    """Decode speculatively, at most k_max positions per step; the lease says how many."""
    emulated_rtt_s: float = 0.0
    """Speculative sessions wait this long before each hop (a WAN on loopback)."""

    model_config = ConfigDict(allow_inf_nan=True)  # merged into Declared's; move_link_bytes may be inf

    @field_validator("timeout_s", "ttl_s", "reload_wait_s", "move_check_s", mode="before")
    @classmethod
    def _positive_seconds(cls, value: Any) -> float:
        return real(value, ok=lambda v: 0 < v < math.inf, want="> 0 seconds")

    @field_validator("max_failovers", "move_prefill_tokens", mode="before")
    @classmethod
    def _count(cls, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError("must be an integer >= 0")
        return value

    @field_validator("move_link_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> float:
        return real(value, ok=lambda v: v >= 0, want=">= 0")

    @field_validator("emulated_rtt_s", mode="before")
    @classmethod
    def _rtt(cls, value: Any) -> float:
        return real(value, ok=lambda v: 0 <= v < 60, want="a number of seconds in [0, 60)")

    @field_validator("move_rule")
    @classmethod
    def _rule(cls, value: str) -> str:
        return one_of(value, RULES)

    @field_validator("move_speeds")
    @classmethod
    def _speeds(cls, value: Any) -> Speeds:
        if not isinstance(value, Speeds):
            raise ValueError("must be a mell.hybrid.Speeds")
        return value

    @field_validator("k_max")
    @classmethod
    def _k_max(cls, value: int | None) -> int | None:
        if value is not None:
            try:
                check_width(value, "k_max")
            except SpecError as exc:  # its wording, without the owner and value our base adds
                raise ValueError(str(exc).removeprefix("k_max: ").rsplit(", got ", 1)[0]) from None
        return value


class LeaseKeeper:
    """Holds one lease: renews it every ttl/3 on the orchestrator loop, releases it exactly once (in the
    background: nothing waits for the orchestrator to hear it)."""

    def __init__(self, orch: BlockingOrchestrator, info: LeaseInfo, ttl_s: float) -> None:
        self.orch = orch
        self.info = info
        self.ttl_s = ttl_s
        self._released = False
        self._lock = threading.Lock()
        self.move_to: LeaseInfo | None = None  # a move the orchestrator offered in a renew reply
        self.checked_s = time.monotonic()
        self.releasing: concurrent.futures.Future | None = None  # the background release, once released
        self._renewer = orch.spawn(self._renew_loop())

    def _heard(self, info: LeaseInfo) -> None:
        """Note a renew reply: a move offered, or none any more; the width the orchestrator wants now."""
        self.move_to = info.migrate_to
        if info.width is not None and info.width != self.info.width:
            self.info = dataclasses.replace(self.info, width=info.width)
        self.checked_s = time.monotonic()

    def check(self) -> LeaseInfo | None:
        """Renew now (at a step boundary) and return the move offered, if any; None when the orchestrator cannot
        be asked (the background renewals go on)."""
        try:
            self._heard(self.orch.run(lambda c: c.renew(self.info.lease_id), timeout_s=defaults.CALL_TIMEOUT_S))
        except Exception as exc:  # an answer next time, or the background renewer sees the lease gone
            log.debug("checking lease %s: %s", self.info.lease_id, exc)
            self.checked_s = time.monotonic()
            return None
        return self.move_to

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
                self._heard(await client.renew(self.info.lease_id))
            except OrchestratorError as exc:
                log.warning("lease %s could not be renewed: %s", self.info.lease_id, exc.message)
                return
            except Exception as exc:  # orchestrator briefly unreachable: try again next period
                log.warning("renewing lease %s failed: %s", self.info.lease_id, exc)

    def release(self) -> None:
        """Stop renewing and give the slot back (idempotent); returns at once. The release is sent in the background
        on the orchestrator loop (:meth:`_release`): a session's close, and so the user's ``generate()``, never waits
        for an orchestrator that cannot be reached; if the release never arrives, the lease's TTL frees the slot."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._renewer.cancel()
        try:
            self.releasing = self.orch.background(self._release())
        except RuntimeError as exc:  # the orchestrator client is closed already: the TTL frees the slot
            log.warning("releasing lease %s: %s; it will expire after %g s", self.info.lease_id, exc, self.ttl_s)

    async def _release(self) -> None:
        """POST the release, retried with exponential backoff while the orchestrator cannot be reached (a restart),
        for at most the client's unreachable_wait_s (the client's own retry); an expired lease is not an error."""
        try:
            client = await self.orch._get_client()
            await client.release(self.info.lease_id)
        except OrchestratorError as exc:
            if exc.status != 404:  # 404: expired or already released
                log.warning("releasing lease %s: %s", self.info.lease_id, exc.message)
        except Exception as exc:  # unreachable for too long (or the client closed): the lease expires after its TTL
            log.warning("releasing lease %s failed (%s); it will expire after %g s", self.info.lease_id, exc,
                        self.ttl_s)
        else:
            log.debug("lease %s released", self.info.lease_id)
