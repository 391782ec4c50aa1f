"""The orchestrator's live width rule: each session's speculative width by greedy(p*) from the measured load, with
headroom; the method table, the width rule and the measured s(k) profile
(docs/moldable.md, "Speculative width on the swarm").

The swarm offers ``units`` width units; a session verifying ``k`` positions per step holds ``k`` of them. The load
is λ = (arrival rate) · E[S] / units, with E[S] a session's service time at width 1; both are measured (EWMA). The
width is drawn from Theorem 1's p* at λ/ρ̄ (the headroom keeps Σ i y ≤ ρ̄ instead of 1, since sessions queue) and
cut to the free units, the rule of ``petals_chain.moldable.policies.allocate``. Fixed widths are the baselines.
"""

from __future__ import annotations

import csv
import io
import json
import math
import threading
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain import defaults
from petals_chain.moldable.width_range import check_width
from petals_chain.model import SpecError
from petals_chain.moldable.policies import allocate, scheme_probabilities
from petals_chain.moldable.speedup import SpeedUp, concave_hull

@dataclass(frozen=True)
class WidthMethod:
    """One way of choosing widths: its name, the simulator's scheme it is (``moldable.policies.SCHEMES``, where one
    exists) and what it does, for --help and the docs."""

    name: str
    scheme: str | None
    help: str


# The method table (one place): the orchestrator's --width, the moldable-live experiment's arms and the simulator's
# schemes where they coincide (fixed-max is the paper's greedy, min(d, free)).
WIDTH_METHODS: dict[str, WidthMethod] = {
    "greedy-p": WidthMethod("greedy-p", "greedy-p",
                            "Theorem 1's p* at the measured load over the headroom, cut to the free units; s(k) as "
                            "measured with as many other sessions in the batched step as hold a lease now"),
    "greedy-p-lone": WidthMethod("greedy-p-lone", "greedy-p",
                                 "greedy-p with the lone session's s(k) whatever the batch (the rule before servers "
                                 "batched their sessions' steps)"),
    "fixed-1": WidthMethod("fixed-1", None, "width 1 always (plain greedy decoding)"),
    "fixed-max": WidthMethod("fixed-max", "greedy", "the widest width d, cut to the free units (the paper's greedy)"),
}
POLICIES = tuple(WIDTH_METHODS)


def width_method(policy: str) -> WidthMethod:
    """The row of ``policy`` in WIDTH_METHODS; SpecError naming the field otherwise."""
    method = WIDTH_METHODS.get(policy)
    if method is None:
        raise SpecError(f"policy: unknown width policy {policy!r}; choose one of {', '.join(POLICIES)}")
    return method


def check_headroom(headroom: float) -> float:
    """ρ̄ in (0, 1]; SpecError naming the field otherwise."""
    if not (isinstance(headroom, (int, float)) and math.isfinite(headroom) and 0 < headroom <= 1):
        raise SpecError(f"headroom: must be in (0, 1], got {headroom!r}")
    return float(headroom)


def capped(speedup: SpeedUp, k_max: int | None) -> SpeedUp:
    """The speed-up restricted to widths 1..k_max (a client that verifies at most k_max positions per step)."""
    if k_max is None or k_max >= speedup.d:
        return speedup
    return SpeedUp(speedup.s[:check_width(k_max, "k_max")])


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
        p = scheme_probabilities(speedup, scaled, "greedy-p")
    return p


def policy_probabilities(policy: str, speedup: SpeedUp, load: float,
                         headroom: float = defaults.TARGET_LOAD) -> np.ndarray:
    """The width law of a policy (WIDTH_METHODS): greedy(p*) (``width_probabilities``), fixed width 1, or the
    simulator's greedy (all mass on d)."""
    scheme = width_method(policy).scheme
    if scheme == "greedy-p":
        return width_probabilities(speedup, load, headroom)
    if scheme is not None:
        return scheme_probabilities(speedup, load, scheme)
    p = np.zeros(speedup.d)
    p[0] = 1.0
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


class WidthPolicy:
    """The width rule over ``units`` width units, without a queue of its own: the measured load (EWMA of the
    inter-arrival times and of the sizes at width 1) and the draw ``min(I, free)``, I from the policy's law.

    The orchestrator (``orchestrator/leasing/widths.py``) uses it behind its lease queue; :class:`WidthChooser` adds a
    FIFO for in-process use. All draws from ``rng``.
    """

    def __init__(self, units: int, speedup: SpeedUp, policy: str, rng: np.random.Generator, *,
                 mean_size_s: float, mean_interarrival_s: float, headroom: float = defaults.TARGET_LOAD,
                 weight: float = 0.2, batched: Mapping[int, SpeedUp] | None = None) -> None:
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise SpecError(f"units: must be an integer >= 1, got {units!r}")
        policy_probabilities(policy, speedup, 0.5, headroom)  # validates policy and headroom
        self.units, self.speedup, self.policy, self.rng = units, speedup, policy, rng
        self.batched = dict(sorted((batched or {}).items()))  # others in the step → s(k) measured so
        self.headroom = headroom
        self.weight = weight
        self.size = RateMeter(mean_size_s, weight)
        self.gap = RateMeter(mean_interarrival_s, weight)
        self._last_arrival_s: float | None = None
        self.chosen: Counter[int] = Counter()  # widths handed out so far

    def reset(self, policy: str, *, mean_size_s: float, mean_interarrival_s: float) -> None:
        """Switch to ``policy`` and start measuring again from these priors (the counts of chosen widths too)."""
        policy_probabilities(policy, self.speedup, 0.5, self.headroom)
        self.policy = policy
        self.size = RateMeter(mean_size_s, self.weight)
        self.gap = RateMeter(mean_interarrival_s, self.weight)
        self._last_arrival_s = None
        self.chosen.clear()

    @property
    def load(self) -> float:
        """The measured λ = E[S] / (E[inter-arrival] · units)."""
        return self.size.mean / (self.gap.mean * self.units)

    def measured_speedup(self, others: int = 0) -> SpeedUp:
        """s(k) with ``others`` sessions sharing each batched step: the profile measured at the nearest count of
        others (the smaller on a tie), the lone session's without a batch profile."""
        if not self.batched:
            return self.speedup
        return self.batched[min(self.batched, key=lambda b: (abs(b - others), b))]

    def speedup_for(self, others: int = 0) -> SpeedUp:
        """The s(k) the policy chooses from with ``others`` sessions holding leases beside this one: the batch
        profile for greedy-p, the lone session's for every other policy (greedy-p-lone ignores the batch; a fixed
        width needs only d)."""
        return self.measured_speedup(others) if self.policy == "greedy-p" else self.speedup

    def probabilities(self, k_max: int | None = None, others: int = 0) -> np.ndarray:
        """The width law now (from the measured load), over widths 1..min(d, k_max), with ``others`` sessions
        sharing the batched step."""
        return policy_probabilities(self.policy, capped(self.speedup_for(others), k_max), self.load, self.headroom)

    def observe_arrival(self, now_s: float) -> None:
        """Record an arrival at ``now_s`` (seconds, any monotone clock)."""
        if self._last_arrival_s is not None:
            self.gap.observe(max(0.0, now_s - self._last_arrival_s))
        self._last_arrival_s = now_s

    def observe_service(self, width: int, service_s: float, others: int = 0) -> None:
        """A session at ``width`` took ``service_s`` beside ``others``: its size at width 1 is service_s · s_width,
        s as measured with that many others (a width past that profile's d counts as its d: wider did not help)."""
        check_width(width, "width", self.speedup.d)
        s = self.measured_speedup(others)
        self.size.observe(service_s * s.s[min(width, s.d) - 1])

    def draw(self, free: int, k_max: int | None = None, others: int = 0) -> int:
        """A width: min(I, free) with I from the law now with ``others`` sessions beside (0 when nothing is free);
        counted in ``chosen``."""
        width = allocate(self.probabilities(k_max, others), free, self.rng)
        if width:
            self.chosen[width] += 1
        return width


class WidthChooser(WidthPolicy):
    """The width rule with a FIFO of sessions waiting for a unit, for a process that runs its sessions itself.

    ``arrive(now)`` records an arrival and returns a ticket; ``start(ticket)`` blocks until the ticket is at the head
    of the queue and a unit is free, then returns its width (min(I, free), I drawn from the policy's law at the
    measured load); ``finish(width, service_s)`` frees the units and measures the session's size at width 1.
    Thread-safe.
    """

    def __init__(self, units: int, speedup: SpeedUp, policy: str, rng: np.random.Generator, *,
                 mean_size_s: float, mean_interarrival_s: float, headroom: float = defaults.TARGET_LOAD,
                 weight: float = 0.2) -> None:
        super().__init__(units, speedup, policy, rng, mean_size_s=mean_size_s,
                         mean_interarrival_s=mean_interarrival_s, headroom=headroom, weight=weight)
        self.free = units
        self.running = 0  # sessions holding units: the others a new session's batched steps are shared with
        self._queue: deque[int] = deque()
        self._next_ticket = 0
        self._cond = threading.Condition()

    def arrive(self, now_s: float) -> int:
        """Record an arrival at ``now_s`` (seconds, any monotone clock); returns its place in the FIFO."""
        with self._cond:
            self.observe_arrival(now_s)
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
            width = self.draw(self.free, others=self.running)
            self.free -= width
            self.running += 1
            self._cond.notify_all()
            return width

    def finish(self, width: int, service_s: float | None = None) -> None:
        """Give ``width`` units back; with ``service_s``, measure the size at width 1 as service_s · s_width."""
        with self._cond:
            if not 1 <= width <= self.units - self.free:
                raise SpecError(f"width: {width} units were not held (free {self.free} of {self.units})")
            self.free += width
            self.running -= 1
            if service_s is not None:  # the others it ran beside, as many as still run (an approximation)
                self.observe_service(width, service_s, others=self.running)
            self._cond.notify_all()


@dataclass(frozen=True)
class SpeedUpProfile:
    """A measured s(k) profile: per count of other sessions sharing each batched step (0: a lone session), the
    speed-up over width 1 measured with that many others, and the service time at width 1 of a lone session (None
    if the file does not give it)."""

    by_others: Mapping[int, SpeedUp]
    service_s: float | None = None

    @property
    def lone(self) -> SpeedUp:
        """The speed-up with the fewest others measured (a lone session's when 0 is measured)."""
        return self.by_others[min(self.by_others)]

    @property
    def batched(self) -> dict[int, SpeedUp]:
        """Every measured count of others and its speed-up, when more than one was measured (else empty: the
        profile says nothing about batching)."""
        return dict(sorted(self.by_others.items())) if len(self.by_others) > 1 else {}


def speedup_profile(path: str | Path) -> SpeedUpProfile:
    """The speed-up s(k) of a measured profile file, per count of other sessions in the batched step, and the
    service time at width 1 it gives.

    CSV with a header, or JSON (a list of row objects, or ``{"rows": [...]}``). Each row has ``width`` and either
    ``tokens_per_s`` (measured: the concave hull is fitted, ``speedup.concave_hull``) or ``speedup`` (a table: it
    must already be increasing and concave, ``speedup.SpeedUp``); ``others`` (how many other sessions shared each
    step while it was measured; 0 when absent) groups the rows into one s(k) per count; ``service_s`` of the width-1
    row of the fewest others is optional. The moldable-live experiment's ``moldable_live_speedup.csv`` is such a
    file. SpecError naming the file otherwise.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"speedup profile {path}: cannot read it: {exc}") from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
            rows = data.get("rows") if isinstance(data, dict) else data
        else:
            rows = list(csv.DictReader(io.StringIO(text)))
    except ValueError as exc:
        raise SpecError(f"speedup profile {path}: malformed: {exc}") from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise SpecError(f"speedup profile {path}: give a non-empty list of rows with 'width' and 'tokens_per_s' "
                        "(or 'speedup')")
    return profile_from_rows(rows, f"speedup profile {path}")


def profile_from_rows(rows: Sequence[Mapping[str, Any]], label: str) -> SpeedUpProfile:
    """The profile of rows already read (a profile file's, or a calibration's in memory): grouped by ``others``,
    one concave hull (``tokens_per_s``) or checked table (``speedup``) per group, and the width-1 ``service_s`` of
    the fewest others. SpecError starting with ``label`` where a row or a group is bad."""
    column = "tokens_per_s" if "tokens_per_s" in rows[0] else "speedup"
    groups: dict[int, list[tuple[int, float, Any]]] = {}
    try:
        for r in rows:
            width, others = float(r["width"]), float(r.get("others") or 0)
            if width != int(width) or others != int(others) or others < 0:
                raise ValueError(f"width {r['width']!r} or others {r.get('others')!r} is not an integer >= 0")
            groups.setdefault(int(others), []).append((int(width), float(r[column]), r.get("service_s")))
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(f"{label}: every row needs an integer 'width' and a number "
                        f"'tokens_per_s' or 'speedup' ({type(exc).__name__}: {exc})") from None
    by_others = {}
    for others, group in sorted(groups.items()):
        widths, values = [w for w, _, _ in group], [v for _, v, _ in group]
        where = f" (others = {others})" if len(groups) > 1 else ""
        try:
            if column == "tokens_per_s":
                by_others[others] = concave_hull(widths, values)
            else:
                if widths != list(range(1, len(widths) + 1)):
                    raise SpecError(f"speedup: a table needs widths 1..d in order, got {widths}")
                by_others[others] = SpeedUp(tuple(values))
        except SpecError as exc:
            raise SpecError(f"{label}{where}: {exc}") from None
    base = next((svc for w, _, svc in groups[min(groups)] if w == 1), None)
    try:
        service_s = float(base) if base not in (None, "") else None
    except (TypeError, ValueError):
        raise SpecError(f"{label}: 'service_s' must be a number, got {base!r}") from None
    if service_s is not None and not (math.isfinite(service_s) and service_s > 0):
        raise SpecError(f"{label}: 'service_s' must be > 0, got {service_s!r}")
    return SpeedUpProfile(by_others, service_s)
