"""Mell Fig. 3 redrawn from the committed GPU measurement: the rows it reads and the growth it reports."""

from __future__ import annotations

import pytest

from petals_chain.experiments import mell_fig3 as m


def test_growth_is_the_step_ratio_between_two_batch_sizes() -> None:
    rows = [{"context": "128", "b": 2, "serial_ms": 7.0, "arena_ms": 4.0, "bare_ms": 3.5},
            {"context": "128", "b": 16, "serial_ms": 56.0, "arena_ms": 5.0, "bare_ms": 3.5}]
    assert m.growth(rows, "128", "serial_ms") == 8.0
    assert m.growth(rows, "128", "arena_ms") == 1.25
    with pytest.raises(ValueError, match="context 1024"):
        m.growth(rows, "1024", "bare_ms")


def test_the_measurement_shows_the_paper_s_flat_range_for_the_batched_steps_only() -> None:
    """What the committed H200 file says (the figure's claim): from 2 to 16 sessions the batched step grows by less
    than half, the one-session-at-a-time server by more than 5x, at every context."""
    rows = m.saved_rows()
    contexts = {r["context"] for r in rows}
    assert contexts >= {"128", "1024"}
    for ctx in contexts:
        assert m.growth(rows, ctx, "arena_ms") < 1.5 and m.growth(rows, ctx, "bare_ms") < 1.5
        assert m.growth(rows, ctx, "serial_ms") > 5
