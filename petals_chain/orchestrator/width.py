"""Each session's speculative width by greedy(p*) from the measured load, with headroom (docs/moldable.md,
"Speculative width on the swarm").

The swarm offers ``units`` width units; a session verifying ``k`` positions per step holds ``k`` of them. The load
is λ = (arrival rate) · E[S] / units, with E[S] a session's service time at width 1; both are measured (EWMA). The
width is drawn from Theorem 1's p* at λ/ρ̄ (the headroom keeps Σ i y ≤ ρ̄ instead of 1, since sessions queue) and
cut to the free units, the rule of ``petals_chain.moldable.policies.allocate``. Fixed widths are the baselines.
"""

from __future__ import annotations

import math
import threading
from collections import deque

import numpy as np

from petals_chain import defaults
from petals_chain.model import SpecError
from petals_chain.moldable.optimal import optimal_allocation
from petals_chain.moldable.policies import allocate
from petals_chain.moldable.speedup import SpeedUp

POLICIES = ("greedy-p", "fixed-1", "fixed-max")


def check_headroom(headroom: float) -> float:
    """ρ̄ in (0, 1]; SpecError naming the field otherwise."""
    if not (isinstance(headroom, (int, float)) and math.isfinite(headroom) and 0 < headroom <= 1):
        raise SpecError(f"headroom: must be in (0, 1], got {headroom!r}")
    return float(headroom)


def width_probabilities(speedup: SpeedUp, load: float, headroom: float = defaults.TARGET_LOAD) -> np.ndarray:
    """P(width = i), i = 1..d: Theorem 1's p* at λ/ρ̄; every session on width 1 once λ/ρ̄ ≥ 1 (no spare units),
    every session on width d at λ = 0."""
    headroom = check_headroom(headroom)
    if not (isinstance(load, (int, float)) and math.isfinite(load) and load >= 0):
        raise SpecError(f"load: must be a finite number >= 0, got {load!r}")
    scaled = load / headroom
    p = np.zeros(speedup.d)
    if scaled >= 1.0:
        p[0] = 1.0
    elif scaled <= 0.0:
        p[-1] = 1.0
    else:
        p = optimal_allocation(speedup, scaled).p.copy()
    return p


def policy_probabilities(policy: str, speedup: SpeedUp, load: float,
                         headroom: float = defaults.TARGET_LOAD) -> np.ndarray:
    """The width law of a policy: greedy(p*) (``width_probabilities``), fixed width 1, or fixed width d."""
    if policy == "greedy-p":
        return width_probabilities(speedup, load, headroom)
    p = np.zeros(speedup.d)
    if policy == "fixed-1":
        p[0] = 1.0
    elif policy == "fixed-max":
        p[-1] = 1.0
    else:
        raise SpecError(f"policy: unknown width policy {policy!r}; choose one of {', '.join(POLICIES)}")
    return p


class RateMeter:
    """Exponentially weighted mean of a quantity, seeded by a prior: inter-arrival times or service sizes."""

    def __init__(self, prior: float, weight: float = 0.2) -> None:
        if not (math.isfinite(prior) and prior > 0):
            raise SpecError(f"prior: must be finite and > 0, got {prior!r}")
        if not 0 < weight <= 1:
            raise SpecError(f"weight: must be in (0, 1], got {weight!r}")
        self.mean, self.weight = float(prior), float(weight)

    def observe(self, value: float) -> None:
        """Fold one observation into the mean (negative or non-finite ones are refused)."""
        if not (math.isfinite(value) and value >= 0):
            raise SpecError(f"observation: must be finite and >= 0, got {value!r}")
        self.mean += self.weight * (value - self.mean)


class WidthChooser:
    """The orchestrator's width rule over ``units`` width units, with a FIFO of sessions waiting for a unit.

    ``arrive(now)`` records an arrival and returns a ticket; ``start(ticket)`` blocks until the ticket is at the head
    of the queue and a unit is free, then returns its width (min(I, free), I drawn from the policy's law at the
    measured load); ``finish(width, service_s)`` frees the units and measures the session's size at width 1.
    Thread-safe; all draws from ``rng``.
    """

    def __init__(self, units: int, speedup: SpeedUp, policy: str, rng: np.random.Generator, *,
                 mean_size_s: float, mean_interarrival_s: float, headroom: float = defaults.TARGET_LOAD,
                 weight: float = 0.2) -> None:
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise SpecError(f"units: must be an integer >= 1, got {units!r}")
        policy_probabilities(policy, speedup, 0.5, headroom)  # validates policy and headroom
        self.units, self.speedup, self.policy, self.rng = units, speedup, policy, rng
        self.headroom = headroom
        self.size = RateMeter(mean_size_s, weight)
        self.gap = RateMeter(mean_interarrival_s, weight)
        self.free = units
        self._last_arrival_s: float | None = None
        self._queue: deque[int] = deque()
        self._next_ticket = 0
        self._cond = threading.Condition()
        self.widths: list[int] = []

    @property
    def load(self) -> float:
        """The measured λ = E[S] / (E[inter-arrival] · units)."""
        return self.size.mean / (self.gap.mean * self.units)

    def probabilities(self) -> np.ndarray:
        """The width law now (from the measured load)."""
        return policy_probabilities(self.policy, self.speedup, self.load, self.headroom)

    def arrive(self, now_s: float) -> int:
        """Record an arrival at ``now_s`` (seconds, any monotone clock); returns its place in the FIFO."""
        with self._cond:
            if self._last_arrival_s is not None:
                self.gap.observe(max(0.0, now_s - self._last_arrival_s))
            self._last_arrival_s = now_s
            ticket = self._next_ticket
            self._next_ticket += 1
            self._queue.append(ticket)
            return ticket

    def start(self, ticket: int, timeout_s: float | None = None) -> int:
        """Wait for the head of the queue and a free unit; the width given (TimeoutError after timeout_s)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._queue[0] == ticket and self.free > 0, timeout_s):
                raise TimeoutError(f"ticket {ticket}: no width unit within {timeout_s} s")
            self._queue.popleft()
            width = allocate(self.probabilities(), self.free, self.rng)
            self.free -= width
            self.widths.append(width)
            self._cond.notify_all()
            return width

    def finish(self, width: int, service_s: float | None = None) -> None:
        """Give ``width`` units back; with ``service_s``, measure the size at width 1 as service_s · s_width."""
        with self._cond:
            if not 1 <= width <= self.units - self.free:
                raise SpecError(f"width: {width} units were not held (free {self.free} of {self.units})")
            self.free += width
            if service_s is not None:
                self.size.observe(service_s * self.speedup.s[width - 1])
            self._cond.notify_all()
