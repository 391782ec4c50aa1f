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
from petals_chain.experiments.common import mean_ci


@dataclass(frozen=True)
class LimitCheck:
    """Measured mean response (s) and the Theorem 3.7 bounds for the measured chains; None where undefined.

    With one chain (or chains of one speed) the two bounds coincide: they are then the exact M/M/c mean, and the
    verdict says so instead of calling a hundredth of a second "above the upper bound"."""

    measured_s: float
    lower_s: float | None
    upper_s: float | None
    arrival_rate_per_s: float
    chains_used: int
    chains_offered: int
    note: str = ""
    measured_ci95_half_s: float = math.nan  # Student-t 95 % half-width of the measured mean (NaN: unknown)
    requests: int = 0  # records the measured mean is over

    @property
    def degenerate(self) -> bool:
        """True when the lower and upper bound are one number (one chain, or chains of one speed: the exact
        M/M/c mean)."""
        return self.lower_s is not None and self.upper_s is not None and \
            math.isclose(self.lower_s, self.upper_s, rel_tol=1e-9)

    def where(self) -> str:
        """Where the measured mean lies against the bounds, its 95 % interval taken into account when known."""
        assert self.lower_s is not None and self.upper_s is not None
        m, h = self.measured_s, self.measured_ci95_half_s
        reach = math.isfinite(h)
        if self.degenerate:
            if reach and m - h <= self.lower_s <= m + h:
                return f"at the exact M/M/c mean, {self.lower_s:.2f} s, within the 95 % interval"
            side = "above" if m > self.lower_s else "below"
            return (f"{side} the exact M/M/c mean, {self.lower_s:.2f} s (the bounds coincide)"
                    + ("" if reach else "; no interval to tell noise from a gap"))
        if self.lower_s <= m <= self.upper_s:
            return "between the bounds"
        if m < self.lower_s:
            return "below the lower bound" + (", but its 95 % interval reaches it" if reach and m + h >= self.lower_s
                                              else "")
        return "above the upper bound" + (", but its 95 % interval reaches it" if reach and m - h <= self.upper_s
                                          else "")

    def describe(self) -> str:
        """One line for logs and the results README."""
        half = f" ± {self.measured_ci95_half_s:.2f}" if math.isfinite(self.measured_ci95_half_s) else ""
        if self.lower_s is None or self.upper_s is None:
            return f"measured mean response {self.measured_s:.2f}{half} s; no bound ({self.note})"
        bounds = (f"Theorem 3.7 bounds [{self.lower_s:.2f}, {self.upper_s:.2f}] s" if not self.degenerate else
                  f"Theorem 3.7 bounds, which coincide at {self.lower_s:.2f} s")
        return (f"measured mean response {self.measured_s:.2f}{half} s vs {bounds} for the measured chains "
                f"({self.where()}; {self.measured_s / self.lower_s:.2f}× the lower bound; λ = "
                f"{self.arrival_rate_per_s:.3f}/s, {self.chains_used} of {self.chains_offered} chains served requests)")

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
    finite = [r.response_s for r in records if math.isfinite(r.response_s)]
    measured, half = mean_ci(finite) if finite else (math.nan, math.nan)
    counted = {"measured_ci95_half_s": half, "requests": len(finite)}
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
        return LimitCheck(measured, None, None, rate, used, len(chains), "no chain or no arrival rate measured",
                          **counted)
    b = theorem37_bounds(rates, caps, rate)
    if not math.isfinite(b.lower_s):
        return LimitCheck(measured, None, None, rate, used, len(chains),
                          "the replayed rate is at least the chains' measured total service rate", **counted)
    return LimitCheck(measured, b.lower_s, b.upper_s, rate, used, len(chains), **counted)


def limits_figure(checks: Mapping[str, LimitCheck], title: str):
    """One column per method: the measured mean response with its 95 % interval (a dot and whiskers) over the
    Theorem 3.7 bounds (a grey band), or, where the bounds coincide, the exact M/M/c mean (a black bar labelled as
    such), or the words "no bound"."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from petals_chain.experiments.common import figure

    fig, axes = figure(figsize=(max(1.7 * len(checks) + 2.4, 7.5), 4.4))
    ax = axes[0][0]
    top = 0.0
    for i, c in enumerate(checks.values()):
        if c.lower_s is not None and c.upper_s is not None:
            if c.degenerate:
                ax.plot([i - 0.3, i + 0.3], [c.lower_s] * 2, color="black", lw=2.5)
            else:
                ax.bar(i, c.upper_s - c.lower_s, 0.6, bottom=c.lower_s, color="0.8", edgecolor="0.5")
            top = max(top, c.upper_s)
        else:
            ax.text(i, 0.02, "no bound", transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=8)
        half = c.measured_ci95_half_s if math.isfinite(c.measured_ci95_half_s) else 0.0
        ax.errorbar(i, c.measured_s, yerr=half, fmt="o", color="tab:blue", capsize=6, lw=1.5, ms=6)
        top = max(top, c.measured_s + half)
    ax.set_xticks(range(len(checks)),
                  [f"{name}\n(n = {c.requests})" if c.requests else name for name, c in checks.items()])
    ax.set_xlim(-0.6, len(checks) - 0.4)
    ax.set_ylim(0, 1.1 * top if top > 0 else None)
    ax.set_ylabel("mean response time (s)")
    ax.set_title(title, fontsize=10)
    handles = [Line2D([], [], ls="", marker="o", color="tab:blue", label="measured mean, 95 % interval")]
    if any(c.lower_s is not None and not c.degenerate for c in checks.values()):
        handles.append(Patch(facecolor="0.8", edgecolor="0.5", label="Theorem 3.7 bounds (measured μ, c, λ)"))
    if any(c.degenerate for c in checks.values()):
        handles.append(Line2D([], [], color="black", lw=2.5,
                              label="bounds coincide: the exact M/M/c mean (one speed of chain)"))
    fig.legend(handles=handles, loc="outside upper center", ncol=2, frameon=False, fontsize=8)
    return fig


def plot_limits(path: Path, checks: Mapping[str, LimitCheck], title: str) -> Path:
    """Draw :func:`limits_figure` to ``path``."""
    from petals_chain.experiments.common import save_figure

    return save_figure(limits_figure(checks, title), path)
