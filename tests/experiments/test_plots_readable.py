"""The results figures can be read: no two pieces of text are drawn over each other, no text is cut off at the
figure's edge, and no legend covers data or text (issue 28, "Evidence a reviewer accepts").

Each figure is built by the same function that draws its committed PNG, from the committed data that PNG is drawn
from (small CSV/JSON files under results/), and checked by ``figure_layout.layout_problems`` (the layout matplotlib
computes, text and legend extents against each other and against the plotted data). The checker is shown to catch a
figure made bad on purpose, so a pass means something.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from typing import Any

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.collections import Collection  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from petals_chain.experiments.common import REPO, read_csv  # noqa: E402
from tests.experiments.figure_layout import layout_problems  # noqa: E402
from tests.experiments.replotting import Replotted  # noqa: E402

RESULTS = REPO / "results"


# ---- the checker catches what it should ---------------------------------------------------------------------------


def test_the_checker_catches_overlapping_text_a_legend_over_data_and_a_cut_label() -> None:
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], label="a line across the middle")
    ax.bar([0.2, 0.8], [0.5, 0.6], 0.1, label="bars")
    ax.legend(loc="center")  # over the line and a bar
    ax.text(0.1, 0.9, "first label")
    ax.text(0.12, 0.9, "second label")  # drawn over the first
    fig.text(0.98, 0.5, "a caption that runs off the right edge")
    problems = layout_problems(fig)
    plt.close(fig)
    assert any("'first label' overlaps text 'second label'" in p for p in problems), problems
    assert any("covers" in p and "plotted points" in p for p in problems), problems
    assert any("bars" in p for p in problems), problems
    assert any("cut off" in p for p in problems), problems


def test_the_same_figure_laid_out_properly_passes() -> None:
    fig, axes = plt.subplots(1, 1, figsize=(4, 3), layout="constrained", squeeze=False)
    ax = axes[0][0]
    ax.plot([0, 1], [0, 1], label="a line across the middle")
    ax.bar([0.2, 0.8], [0.5, 0.6], 0.1, label="bars")
    ax.text(0.1, 0.9, "first label")
    ax.text(0.1, 0.8, "second label")
    fig.legend(loc="outside lower center", ncol=2)
    problems = layout_problems(fig)
    plt.close(fig)
    assert problems == []


# ---- the results figures ----------------------------------------------------------------------------------------


def _fig8() -> Any:
    from petals_chain.experiments import fig8_overall as f

    return f.figure(read_csv(RESULTS / "fig8.csv"), f.FULL["Js"], f.FULL["etas"], f.FULL["runs"])


def _migration() -> Any:
    from petals_chain.experiments import migration_jffc as m

    return m.migration_figure(*m.saved_plot_data(RESULTS))


def _fig10() -> Any:
    from petals_chain.experiments import fig10_communication as f

    return f.figure(read_csv(RESULTS / "fig10.csv"), (32, 8))


def _gpu_script() -> Any:
    spec = importlib.util.spec_from_file_location("fit_and_plot", REPO / "experiments" / "gpu" / "fit_and_plot.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _gpu(which: str) -> Any:
    mod = _gpu_script()
    d = RESULTS / "gpu"
    raw = json.loads((d / "tau_raw.json").read_text())
    fit = json.loads((d / "fit.json").read_text())
    fit["graphs_raw"] = json.loads((d / "tau_graphs_raw.json").read_text()) if fit.get("graphs") else None
    sheet = mod.datasheet(raw["gpu"].get("name", "cpu"))
    return mod.concurrency_figure(raw, fit, sheet) if which == "tau" else mod.fig9_figure(raw, fit, sheet)


def _width_batch() -> Any:
    spec = importlib.util.spec_from_file_location("width_batch", REPO / "experiments" / "gpu" / "width_batch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    info, rows = mod.pooled(RESULTS / "gpu-width-batch")
    prof = mod.profile(rows, RESULTS / "moldable_live_speedup.csv", 2048)
    return mod.width_batch_figure(info, rows, prof)


def _mell_consolidate() -> Any:
    from petals_chain.experiments import mell_consolidate as m

    return m.consolidate_figure(*m.saved_plot_data(RESULTS))


def _table1(folder: str) -> Any:
    from petals_chain.experiments import table1_report as t

    stats, results, _ = t.load_saved(RESULTS / folder)
    return t.table1_figure(stats, results)


def _limit(folder: str) -> Any:
    from petals_chain.experiments import table1_report as t
    from petals_chain.experiments.limit import limits_figure

    _, results, infos = t.load_saved(RESULTS / folder)
    return limits_figure(t.limit_checks(infos, results), t.LIMIT_TITLE)


def _moldable_live() -> Any:
    from petals_chain.experiments import moldable_live as m

    return m.live_figure(*m.saved_plot_data(RESULTS))


def _fig3() -> Any:
    from petals_chain.experiments import fig3_placement as f

    rows = f.saved_rows(RESULTS)
    return f.placement_figure(rows, list(f.CASES), sorted({r["arrival_rate"] for r in rows}))


def _mell(name: str, key: str, policies: tuple[str, ...]) -> Any:
    from petals_chain.experiments import mell_common as mc

    rows = read_csv(RESULTS / f"{name}.csv")
    for r in rows:
        r["utilisation_pct"] = 100 * r["utilisation"]
    return mc.bar_figure(rows, key, policies, key, name)


def _mell_fig3() -> Any:
    from petals_chain.experiments import mell_fig3 as m

    return m.fig3_figure(m.saved_rows())


def _mell_fig6() -> Any:
    from petals_chain.experiments import mell_fig6 as m

    return m.fig6_figure(m.saved_rows(RESULTS))


def _mell_theorem2() -> Any:
    from petals_chain.experiments import mell_theorem2 as m

    return m.theorem2_figure(m.saved_rows(RESULTS))


def _torta(keys: list[tuple[str, str]]) -> Any:
    from petals_chain.experiments import torta_common as tc

    return tc.bar_figure(tc.read_rows(RESULTS / "torta-runs.csv"), keys, "TORTA")


def _torta_live() -> Any:
    from petals_chain.experiments import torta_live as t

    means = json.loads((RESULTS / "torta-live.json").read_text())["data"]["replications"]
    return t.live_figure(read_csv(RESULTS / "torta-live.csv"), means)


def _moldable_fig2() -> Any:
    from petals_chain.experiments import moldable_fig2 as m

    rows = m.saved_rows(RESULTS)
    return m.fig2_figure(rows, rows[0]["runs"], rows[0]["arrivals"])


def _profile(stem: str) -> Any:
    from petals_chain.launch import profile_results as pr

    profile = pr.load_profile(RESULTS / "profile" / f"{stem}.json")
    samples = pr.read_samples_csv(RESULTS / "profile" / f"{stem}_samples.csv")
    return pr.profile_figure(samples, profile.fits, pr.grid_base(samples, profile.num_blocks), profile.num_blocks,
                             f"profile of {profile.testbed}")


FIGURES: dict[str, Callable[[], Any]] = {
    "fig8.png": _fig8,
    "migration-jffc.png": _migration,
    "fig10.png": _fig10,
    "gpu/tau_concurrency.png": lambda: _gpu("tau"),
    "gpu/fig9_gpu.png": lambda: _gpu("fig9"),
    "gpu-width-batch/width_batch.png": _width_batch,
    "table1.png": lambda: _table1("."),
    "table1-full/table1_limit.png (a band and coinciding bounds)": lambda: _limit("table1-full"),
    "moldable_live.png": _moldable_live,
    "fig3.png": _fig3,
    "mell_fig14.png": lambda: _mell("mell_fig14", "utilisation_pct",
                                    ("Mell", "BF", "WF", "LB", "BF-p", "WF-p", "LB-p")),
    "mell_fig6.png": _mell_fig6,
    "mell_fig3.png": _mell_fig3,
    "mell_theorem2.png": _mell_theorem2,
    "torta-fig9.png": lambda: _torta([("power_cost", "power cost"), ("switching", "switching")]),
    "torta-fig10.png": lambda: _torta([("load_balance", "load balance"), ("load_balance_horizon", "per server")]),
    "moldable_fig2.png": _moldable_fig2,
    "torta-live.png": _torta_live,
    "mell-consolidate.png": _mell_consolidate,
    "profile/cpu-emulated-regime-x9.png": lambda: _profile("cpu-emulated-regime-x9"),
}


@pytest.mark.parametrize("name", list(FIGURES))
def test_results_figure_is_readable(name: str) -> None:
    fig = FIGURES[name]()
    try:
        problems = layout_problems(fig)
    finally:
        plt.close(fig)
    assert problems == [], f"{name}: " + "; ".join(problems)


def test_fig8_marks_overloaded_cells_instead_of_drawing_their_mean() -> None:
    """A cell with an overloaded run has no steady-state mean: fig8 writes "overloaded n/runs" there and draws no
    bar, so no bar is taller than the largest stable mean plus its interval."""
    rows = read_csv(RESULTS / "fig8.csv")
    fig = _fig8()
    try:
        words = [t.get_text() for t in fig.findobj(Text) if t.get_text().startswith("overloaded ")]
        heights = [p.get_height() for ax in fig.axes for p in ax.patches if isinstance(p, Rectangle)]
    finally:
        plt.close(fig)
    overloaded = [r for r in rows if r["overloaded_runs"] and r["feasible_runs"]]
    assert len(words) == len(overloaded) > 0
    stable = [r["mean_response_s"] for r in rows if r["feasible_runs"] and not r["overloaded_runs"]]
    assert max(heights) <= max(stable) + 1e-9


def test_fig10_draws_no_communication_time_below_zero() -> None:
    fig = _fig10()
    try:
        fig.draw_without_rendering()
        lows = [ax.get_ylim()[0] for ax in fig.axes]
        marks = [c for ax in fig.axes for c in ax.collections if isinstance(c, Collection)
                 and len(c.get_offsets()) and float(np.min(np.asarray(c.get_offsets())[:, 1])) < 0]
    finally:
        plt.close(fig)
    assert all(low == 0 for low in lows) and not marks


def test_the_limit_figure_labels_coinciding_bounds_as_the_exact_mean() -> None:
    fig = _limit("table1-full")  # paper's composition: one chain, its bounds one number
    try:
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
    finally:
        plt.close(fig)
    assert any("coincide" in label and "exact M/M/c mean" in label for label in labels)



def test_every_figure_a_replottable_experiment_draws_is_readable(replotted: Replotted) -> None:
    """Beyond the figures above: each one the experiments redraw from their files (fig5, fig6, torta-fig11, the
    Mell and TORTA figures, ...) passes the same checks."""
    found = replotted.figures
    assert len(found) >= 20  # the walk really redrew the figures
    bad = {name: problems for name, problems in found.items() if problems}
    assert bad == {}, "; ".join(f"{n}: {', '.join(p[:3])}" for n, p in bad.items())
