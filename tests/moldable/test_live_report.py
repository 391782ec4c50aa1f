"""The moldable-live report says plainly whether greedy(p*) helped, and only beyond the noise."""

from __future__ import annotations

import math

from petals_chain.experiments.moldable_live import verdict


def _cell(g: float, g_ci: float, one: float, one_ci: float, top: float, top_ci: float,
          g_width: float = 2.5) -> dict[str, dict]:
    """One load's rows: mean response, its CI half-width and the mean width per policy."""
    return {"greedy-p": {"response_s": g, "response_ci_s": g_ci, "mean_width": g_width},
            "fixed-1": {"response_s": one, "response_ci_s": one_ci, "mean_width": 1.0},
            "fixed-max": {"response_s": top, "response_ci_s": top_ci, "mean_width": 8.0}}


def test_verdict_names_the_better_fixed_width_and_needs_a_clear_gap() -> None:
    """Lower than both fixed widths by more than the intervals: helps; higher: does NOT help; overlapping: no clear
    difference; missing intervals: no verdict; the same widths: noise, whatever the gap."""
    assert verdict(_cell(10, 1, 20, 1, 15, 1)).startswith("greedy(p*) helps: 33% lower mean response than the better "
                                                          "fixed width (fixed-max)")
    assert verdict(_cell(30, 1, 20, 1, 25, 1)).startswith("greedy(p*) does NOT help: 50% higher mean response than "
                                                          "fixed-1")
    assert verdict(_cell(14, 2, 20, 1, 15, 2)).startswith("no clear difference between greedy(p*) and fixed-max")
    assert verdict(_cell(10, math.nan, 20, 1, 15, 1)).startswith("too few sessions")
    same = verdict(_cell(10, 1, 20, 1, 30, 1, g_width=1.0))  # both ran width 1: the gap cannot be the width's
    assert same.startswith("greedy(p*) ran the widths fixed-1 runs (mean 1.00): the -50% between them is the shared")
