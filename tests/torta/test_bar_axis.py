"""The TORTA bar figures' axis: cut above one method's collapse, whole where values merely differ by topology."""

from __future__ import annotations

import math

from petals_chain.experiments.torta_common import axis_top


def test_a_collapsed_method_is_cut_and_the_others_keep_their_scale() -> None:
    # Fig 8 of the full run: every method near 30-45 s, RL-no-OT at 288 and 595 s (mean + CI) on two topologies
    tops = [32, 45, 44, 42, 31, 33, 35, 28, 33, 35, 36, 28, 28, 29, 29, 36, 35, 37, 29, 29, 288, 29, 38, 35, 37, 29,
            29, 595]
    assert axis_top(tops) == 1.25 * 45


def test_a_spread_without_a_jump_keeps_the_whole_axis() -> None:
    # Fig 9's switching: 0.08 on Polska up to 15.7 on Cost266, rising by less than 3x from one bar to the next
    tops = [0.6, 1.7, 2.3, 2.2, 5.2, 1.0, 1.6, 0.16, 0.85, 0.83, 0.79, 1.3, 0.4, 0.09, 0.8, 3.3, 3.7, 3.7, 7.4, 1.7,
            2.5, 3.0, 9.5, 12.8, 12.8, 15.7, 6.9, 12.6]
    assert axis_top(tops) == math.inf
    assert axis_top([]) == math.inf and axis_top([float("nan"), 1.0]) == math.inf
