"""A paired comparison of two policies over replications (each replication runs both on the same inputs): the mean
difference, its 95 % Student-t interval, whether the interval excludes zero, and the smallest true difference the
run would detect with 80 % power, so that a run too small to decide says so with a number.

The power figure is the usual normal-theory one for a paired t-test at two-sided level α: a true mean difference
δ is detected with probability 1 − β once δ ≥ (t_{1−α/2, n−1} + t_{1−β, n−1}) · s / √n, s the sample standard
deviation of the differences. It uses the run's own s, so it says what this run could see, not what a larger one
would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = ["Paired", "paired"]


@dataclass(frozen=True)
class Paired:
    """The paired differences' mean, 95 % half-width, count, and the difference detectable with 80 % power."""

    mean: float
    half_width: float
    n: int
    detectable: float

    @property
    def decided(self) -> bool:
        """The 95 % interval excludes zero."""
        return self.n >= 2 and abs(self.mean) > self.half_width

    def text(self, unit: str = "", digits: int = 1) -> str:
        """E.g. '+6.2 ± 3.1 s (decided, n = 6)' or '+1.0 ± 4.0 s (not decided, n = 6; 80 % power from 5.6 s)'."""
        f = f"{{:+.{digits}f}}"
        g = f"{{:.{digits}f}}"
        head = f"{f.format(self.mean)} ± {g.format(self.half_width)}{unit}"
        if self.n < 2:
            return f"{head} (one replication: no interval)"
        if self.decided:
            return f"{head} (95 % interval excludes 0, n = {self.n})"
        return (f"{head} (95 % interval includes 0, n = {self.n}; this run detects a true difference of "
                f"{g.format(self.detectable)}{unit} or more with 80 % power)")


def paired(differences: Sequence[float], level: float = 0.95, power: float = 0.80) -> Paired:
    """The paired summary of ``differences`` (one per replication: policy A's figure minus policy B's)."""
    d = np.asarray(differences, dtype=float)
    if d.size == 0:
        raise ValueError("paired: no differences")
    mean = float(d.mean())
    if d.size < 2:
        return Paired(mean, math.inf, int(d.size), math.inf)
    s = float(d.std(ddof=1))
    df = d.size - 1
    half = float(stats.t.ppf(0.5 + level / 2, df)) * s / math.sqrt(d.size)
    detectable = (float(stats.t.ppf(0.5 + level / 2, df)) + float(stats.t.ppf(power, df))) * s / math.sqrt(d.size)
    return Paired(mean, half, int(d.size), detectable)
