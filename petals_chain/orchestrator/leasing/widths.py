"""The orchestrator chooses each speculative session's width (docs/moldable.md, "Width through the lease API").

A lease request that says it decodes speculatively (``k_max``) gets a width ``k`` in the lease reply: greedy(p*) (or
a fixed width, ``--width``) from the load the orchestrator measures itself (the gaps between lease requests and the
time leases are held, as a size at width 1: held · s(width)), with the headroom ρ̄ = ``--target-load``. The width
units are the offered slots (the chains' capacities): a lease at width k holds k units, any other lease one, and a
width is cut to the units left free (never below 1: a granted lease always runs). Sessions wait for a slot in the
lease queue, not for units, so units can be over-committed; a renew then cuts the widest widths back. With a profile
measured beside other sessions (its ``others`` column), greedy-p chooses from the s(k) measured with as many others
as hold a lease when the lease is granted: on servers that batch their sessions' steps, width and batch share the
rows of one step (docs/moldable.md, "Width against batching").
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from petals_chain.model import SpecError
from petals_chain.orchestrator.leasing.leases import Lease, LeaseManager
from petals_chain.moldable.live import WidthPolicy, width_method
from petals_chain.moldable.speedup import SpeedUp


class LeaseWidths:
    """Widths of the speculative leases of one lease manager, chosen by a :class:`WidthPolicy` whose units follow
    the offered capacity; every method runs on the event loop."""

    def __init__(
        self,
        speedup: SpeedUp,
        policy: str,
        rng: np.random.Generator,
        *,
        mean_size_s: float,
        mean_interarrival_s: float,
        headroom: float,
        clock: Callable[[], float] = time.monotonic,
        batched: Mapping[int, SpeedUp] | None = None,
    ) -> None:
        """Built before the orchestrator and handed to it, which binds it to its lease manager (:meth:`bind`);
        ``batched``: s(k) measured with so many other sessions in each batched step (a profile's ``others``)."""
        self.clock = clock
        self.priors = (mean_size_s, mean_interarrival_s)
        self.rule = WidthPolicy(
            1, speedup, policy, rng, mean_size_s=mean_size_s, mean_interarrival_s=mean_interarrival_s,
            headroom=headroom, batched=batched,
        )
        self._widths: dict[str, int] = {}  # lease id → width, for leases that asked for one
        self._others: dict[str, int] = {}  # lease id → other leases held when it was granted

    def bind(self, leases: LeaseManager) -> None:
        """Choose widths for the leases of ``leases`` (the orchestrator's constructor calls this once)."""
        self.leases = leases

    @property
    def units(self) -> int:
        """Width units now: the slots of the chains offered (at least one)."""
        return max(1, sum(self.leases.snapshot().capacities))

    def _live(self) -> dict[str, int]:
        """Widths of the leases still held (those that ended are forgotten here)."""
        for lease_id in [x for x in self._widths if not self.leases.has(x)]:
            del self._widths[lease_id]
            self._others.pop(lease_id, None)
        return self._widths

    def in_use(self, exclude: str | None = None) -> int:
        """Units held: each speculative lease its width, every other lease one (``exclude`` not counted)."""
        widths = self._live()
        return sum(widths.get(x.lease_id, 1) for x in self.leases.leases() if x.lease_id != exclude)

    def arrival(self) -> None:
        """A lease request arrived (every request: all sessions load the swarm)."""
        self.rule.observe_arrival(self.clock())

    def grant(self, lease: Lease, k_max: int) -> int:
        """The width of a lease just granted to a request with ``k_max``: min(I, free units), at least 1; a retried
        request that already holds its lease keeps its width."""
        held = self._live().get(lease.lease_id)
        if held is not None:
            return held
        self.rule.units = self.units
        free = max(1, self.rule.units - self.in_use(exclude=lease.lease_id))
        others = self.others(exclude=lease.lease_id)
        width = self.rule.draw(free, k_max, others)
        self._widths[lease.lease_id] = width
        self._others[lease.lease_id] = others
        return width

    def others(self, exclude: str | None = None) -> int:
        """Leases held now (``exclude`` not counted): the sessions whose steps a new one's are batched with. The
        chains are not told apart: with several, this overstates the batch a session meets."""
        return sum(1 for x in self.leases.leases() if x.lease_id != exclude)

    def width(self, lease_id: str) -> int | None:
        """The width of a lease (None: it asked for none)."""
        return self._live().get(lease_id)

    def renew(self, lease_id: str) -> int | None:
        """At a renew: the lease's width, cut back by the units over-committed (capacity shrank, or sessions came in
        while wide ones held the units), never below 1."""
        width = self.width(lease_id)
        if width is None or width == 1:
            return width
        excess = self.in_use() - self.units
        if excess > 0:
            width = max(1, width - excess)
            self._widths[lease_id] = width
        return width

    def release(self, lease: Lease, held_s: float) -> None:
        """A lease ended after ``held_s``: its size at width 1 is measured and its units come back."""
        width = self._widths.pop(lease.lease_id, 1)
        self.rule.observe_service(width, held_s, self._others.pop(lease.lease_id, 0))

    def carry(self, old_id: str, new: Lease) -> None:
        """A lease replaced by another (a failover, a move): the new one keeps the old one's width."""
        width, others = self._widths.pop(old_id, None), self._others.pop(old_id, 0)
        if width is not None and self.leases.has(new.lease_id):
            self._widths[new.lease_id] = width
            self._others[new.lease_id] = others

    def set_policy(self, policy: str, arrival_rate: float | None = None) -> None:
        """Switch the policy (an operator's switch) and measure afresh from the priors; ``arrival_rate`` (requests
        per second) replaces the prior inter-arrival time."""
        gap = self.priors[1]
        if arrival_rate is not None:
            if not arrival_rate > 0:
                raise SpecError(f"arrival_rate: must be > 0 requests per second, got {arrival_rate!r}")
            gap = 1.0 / arrival_rate
        self.rule.reset(policy, mean_size_s=self.priors[0], mean_interarrival_s=gap)

    def active(self) -> Counter[int]:
        """Speculative leases held now, by width."""
        return Counter(self._live().values())

    def to_json(self) -> dict[str, Any]:
        """GET /width: the policy, the measured load and its parts, the law now, the widths chosen and held."""
        rule = self.rule
        rule.units = self.units
        return {
            "policy": rule.policy,
            "scheme": width_method(rule.policy).scheme,
            "speedup": list(rule.speedup.s),
            "speedup_by_others": {str(b): list(sp.s) for b, sp in rule.batched.items()},
            "others_now": self.others(),
            "headroom": rule.headroom,
            "units": rule.units,
            "units_in_use": self.in_use(),
            "load": rule.load,
            "mean_size_s": rule.size.mean,
            "mean_interarrival_s": rule.gap.mean,
            "probabilities": [float(p) for p in rule.probabilities(others=self.others())],
            "chosen": {str(k): n for k, n in sorted(rule.chosen.items())},
            "active": {str(k): n for k, n in sorted(self.active().items())},
        }
