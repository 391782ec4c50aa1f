"""The distance to the limit: a live replay's measured mean response time next to the Theorem 3.7 bounds.

The bounds are computed for the chains the orchestrator actually offered (their capacities c_k) with the
service rates actually measured on them (μ_k = 1 / the mean service time of the requests each served) and the
arrival rate actually replayed, so a measured mean below the lower bound or far above the upper one says the
model or the measurement is off (docs/model.md, "Response-time bounds").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.analysis.bounds import theorem37_bounds


@dataclass(frozen=True)
class LimitCheck:
    """Measured mean response (s) and the Theorem 3.7 bounds for the measured chains; None where undefined."""

    measured_s: float
    lower_s: float | None
    upper_s: float | None
    arrival_rate_per_s: float
    chains_used: int
    chains_offered: int
    note: str = ""

    def describe(self) -> str:
        """One line for logs and the results README."""
        if self.lower_s is None or self.upper_s is None:
            return f"measured mean response {self.measured_s:.2f} s; no bound ({self.note})"
        where = ("below the lower bound" if self.measured_s < self.lower_s else
                 "above the upper bound" if self.measured_s > self.upper_s else "between the bounds")
        return (f"measured mean response {self.measured_s:.2f} s vs Theorem 3.7 bounds [{self.lower_s:.2f}, "
                f"{self.upper_s:.2f}] s for the measured chains ({where}; {self.measured_s / self.lower_s:.2f}× the "
                f"lower bound; λ = {self.arrival_rate_per_s:.3f}/s, {self.chains_used} of {self.chains_offered} "
                f"chains served requests)")

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def chain_route(chain: Mapping[str, Any]) -> str:
    """A chain of the orchestrator's /chains written as a request record's route: 's1[0:15] -> s2[15:30]'."""
    return " -> ".join(f"{h['server']}[{h['start']}:{h['end']}]" for h in chain["spans"])


def distance_to_limit(records: Sequence[Any], chains: Sequence[Mapping[str, Any]]) -> LimitCheck:
    """The bounds for ``chains`` (capacity, spans, optionally service_time_s) with μ measured from ``records``.

    A chain no finished request used keeps its predicted service time (``service_time_s``) if it has one and is
    left out otherwise; records with an error or censored at the cutoff count in the measured mean only."""
    done = [r for r in records if not r.error and not r.censored and math.isfinite(r.response_s)]
    measured = float(np.mean([r.response_s for r in records if math.isfinite(r.response_s)])) if records else math.nan
    arrivals = np.sort([r.arrival_s for r in records])
    rate = (arrivals.size - 1) / float(arrivals[-1] - arrivals[0]) if arrivals.size > 1 and arrivals[-1] > arrivals[0] \
        else math.nan
    rates, caps, used = [], [], 0
    for chain in chains:
        served = [r.service_s for r in done if r.route == chain_route(chain)]
        if served:
            used += 1
            rates.append(1.0 / float(np.mean(served)))
        elif chain.get("service_time_s"):
            rates.append(1.0 / float(chain["service_time_s"]))
        else:
            continue
        caps.append(int(chain["capacity"]))
    if not rates or not math.isfinite(rate):
        return LimitCheck(measured, None, None, rate, used, len(chains), "no chain or no arrival rate measured")
    b = theorem37_bounds(rates, caps, rate)
    if not math.isfinite(b.lower_s):
        return LimitCheck(measured, None, None, rate, used, len(chains),
                          "the replayed rate is at least the chains' measured total service rate")
    return LimitCheck(measured, b.lower_s, b.upper_s, rate, used, len(chains))


def plot_limits(path: Path, checks: Mapping[str, LimitCheck], title: str) -> Path:
    """One group per method: the measured mean response as a bar, the bounds as an interval over it."""
    from petals_chain.experiments.common import plt

    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(1.8 * max(len(checks), 2) + 2, 4))
    for i, (name, c) in enumerate(checks.items()):
        ax.bar(i, c.measured_s, 0.5, color="tab:blue", label="measured mean response" if i == 0 else None)
        if c.lower_s is not None and c.upper_s is not None:
            ax.errorbar(i, (c.lower_s + c.upper_s) / 2, yerr=(c.upper_s - c.lower_s) / 2, fmt="none", ecolor="black",
                        capsize=8, lw=2, label="Theorem 3.7 bounds (measured μ, c, λ)" if i == 0 else None)
        else:
            ax.text(i, c.measured_s, "no bound", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(checks)))
    ax.set_xticklabels(list(checks))
    ax.set_ylabel("mean response time (s)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)
    return path
