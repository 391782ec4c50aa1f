"""``--quick`` is a scaled copy of the full TORTA setting: the same shape of day on fewer slots.

docs/torta.md, "Quick and full settings". For the full setting, the quick one and other horizons: the surge starts
and ends strictly inside the horizon at the same relative times (within a slot), the diurnal cycle spans the same
fraction of a day (the weights of the workload itself are compared slot for slot), the warm start is the same
fraction; a bad scale or a horizon too short for the surge is a one-line ValueError.
"""

from __future__ import annotations

import math
from argparse import Namespace

import numpy as np
import pytest

from petals_chain.experiments.torta_common import settings
from petals_chain.torta.params import DEFAULT, QUICK_SCALE, TortaParamError, TortaParams, scaled
from petals_chain.torta.topology import load_regions
from petals_chain.torta.workload import origin_weights

QUICK = settings(Namespace(quick=True)).params
FULL = settings(Namespace(quick=False)).params
# the full and quick settings, and other horizons from 8 slots to twice the full 480
HORIZONS = [FULL, QUICK] + [scaled(DEFAULT, s) for s in (1 / 60, 1 / 30, 0.1, 1 / 8, 0.25, 0.5, 2.0)]


def rel(slot: float, p: TortaParams) -> float:
    """A slot as a fraction of the horizon."""
    return slot / p.slots


def test_the_quick_setting_is_the_full_one_on_32_slots() -> None:
    assert FULL == DEFAULT and FULL.slots == 480
    assert QUICK.slots == 32 == round(FULL.slots * QUICK_SCALE)
    assert QUICK.slot_s == FULL.slot_s  # the slot length stays: fewer slots, not longer ones
    assert QUICK.warm_start_slots == 1 < 5 == FULL.warm_start_slots  # not 5 of 32 slots any more
    assert QUICK.surge_window() == (16, 19) and FULL.surge_window() == (240, 280)


@pytest.mark.parametrize("p", HORIZONS, ids=lambda p: f"{p.slots}slots")
def test_surge_lies_strictly_inside_at_the_same_relative_times(p: TortaParams) -> None:
    start, end = p.surge_window()
    f_start, f_end = FULL.surge_window()
    assert 0 < start < end < p.slots
    assert abs(start - rel(f_start, FULL) * p.slots) <= 1 and abs(end - rel(f_end, FULL) * p.slots) <= 1


@pytest.mark.parametrize("p", HORIZONS, ids=lambda p: f"{p.slots}slots")
def test_day_and_warm_start_span_the_same_fractions(p: TortaParams) -> None:
    assert p.slots / p.slots_per_day == pytest.approx(FULL.slots / FULL.slots_per_day) == 0.25  # 6 h of 24 h
    assert abs(p.warm_start_slots - rel(FULL.warm_start_slots, FULL) * p.slots) <= 1
    assert p.warm_start_slots >= 1  # slot 0 has no history to size a pool on


def test_the_workload_has_the_same_day_on_both_horizons() -> None:
    """The weights of the quick run's slot t equal the full run's at slot 15·t (same time of the compressed day),
    and the surge multiplies one origin by surge_factor over exactly the window, nowhere else."""
    regions = load_regions("polska", DEFAULT, np.random.default_rng(0))
    flat = {name: p.with_(surge_factor=1.0) for name, p in (("quick", QUICK), ("full", FULL))}
    wq = origin_weights(regions, flat["quick"], QUICK.slots, np.random.default_rng(1))
    wf = origin_weights(regions, flat["full"], FULL.slots, np.random.default_rng(1))
    step = FULL.slots // QUICK.slots
    np.testing.assert_allclose(wq, wf[::step], rtol=1e-12)
    assert np.ptp(wq.sum(1)) > 0.01  # the cycle is seen within the quick run (it was flat on 24 min of a day)
    for p, flat_w in ((QUICK, wq), (FULL, wf)):
        ratio = origin_weights(regions, p, p.slots, np.random.default_rng(1)) / flat_w
        start, end = p.surge_window()
        surged = np.flatnonzero(np.isclose(ratio, p.surge_factor).any(0))
        assert surged.size == 1  # one origin
        col = ratio[:, surged[0]]
        assert np.allclose(col[start:end], p.surge_factor) and np.allclose(np.delete(ratio, slice(start, end), 0), 1)


@pytest.mark.parametrize("scale", [0, -0.5, math.nan, math.inf, True, "0.1"])
def test_a_bad_scale_is_one_line(scale) -> None:
    with pytest.raises(ValueError, match=r"^scale: must be a positive finite number, got") as exc:
        scaled(DEFAULT, scale)
    assert "\n" not in str(exc.value)


def test_a_horizon_too_short_for_the_surge_is_one_line() -> None:
    with pytest.raises(TortaParamError, match=r"^scale 0\.005: 2 slots are too short to hold the surge") as exc:
        scaled(DEFAULT, 0.005)
    assert "\n" not in str(exc.value) and isinstance(exc.value, ValueError)
    with pytest.raises(TortaParamError, match=r"leaves no slot"):
        scaled(DEFAULT, 1e-4)
    with pytest.raises(TortaParamError, match=r"^surge: slots \[240, 280\) must lie strictly inside a horizon of 100"):
        DEFAULT.with_(slots=100)  # a shorter horizon is scaled(), not a bare slot count
    assert scaled(DEFAULT.with_(surge_slots=0), 0.005).surge_window() == (0, 0)  # no surge: any horizon holds it
