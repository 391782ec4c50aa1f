"""The results figures can be read: no two pieces of text are drawn over each other, no text is cut off at the
figure's edge, and no legend covers data or text (issue 28, "Evidence a reviewer accepts").

Each figure is built by the same function that draws its committed PNG, from the committed data that PNG is drawn
from (small CSV/JSON files under results/), and laid out by matplotlib (``fig.draw_without_rendering()``: the draw
of ``fig.canvas.draw()`` without the pixels); then every text artist's window extent is compared with every
other's and with each legend's, and each legend's extent with the display coordinates of the plotted lines,
markers, bars and shaded areas. The checker is shown to catch a figure made bad on purpose, so a pass means
something.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.collections import Collection, PathCollection  # noqa: E402
from matplotlib.legend import Legend  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from petals_chain.experiments.common import REPO, read_csv  # noqa: E402

RESULTS = REPO / "results"
TOL_PX = 1.0  # boxes that share less than a pixel in either direction do not overlap
SAMPLES_PER_SEGMENT = 16  # points checked along each drawn line segment


# ---- the checker ------------------------------------------------------------------------------------------------


def _overlap(a: Bbox, b: Bbox, tol: float = TOL_PX) -> bool:
    """True when the two display boxes share more than ``tol`` pixels in both directions."""
    return min(a.x1, b.x1) - max(a.x0, b.x0) > tol and min(a.y1, b.y1) - max(a.y0, b.y0) > tol


def _shown_texts(fig: Any) -> list[Text]:
    """Every text artist that is drawn: tick labels at ticks inside their axis' view, and every other visible,
    non-empty text (titles, labels, annotations, legend entries, captions)."""
    ticks: set[int] = set()
    out: list[Text] = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            span = (hi - lo) * 1e-9
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                for label in (tick.label1, tick.label2):
                    ticks.add(id(label))
                    if label.get_visible() and label.get_text().strip() and lo - span <= tick.get_loc() <= hi + span:
                        out.append(label)
    for t in fig.findobj(Text):
        if id(t) not in ticks and t.get_visible() and t.get_text().strip() and t.figure is not None:
            out.append(t)
    return list({id(t): t for t in out}.values())


def _legends(fig: Any) -> list[Legend]:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]


def _data_points(ax: Any) -> np.ndarray:
    """Display coordinates of what ``ax`` plots: line vertices and points along each segment, markers, error bar
    segments and the vertices of shaded areas; only those inside the axes (the rest is clipped)."""
    pts: list[np.ndarray] = []
    for line in ax.lines:
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        xy = xy[np.all(np.isfinite(xy), axis=1)]
        if len(xy) == 1 or line.get_linestyle() in ("None", "", " ", "none"):
            pts.append(xy)
            continue
        for a, b in zip(xy, xy[1:]):
            pts.append(a + np.linspace(0, 1, SAMPLES_PER_SEGMENT)[:, None] * (b - a))
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        if isinstance(coll, PathCollection) and len(coll.get_offsets()):
            pts.append(coll.get_offset_transform().transform(np.asarray(coll.get_offsets(), dtype=float)))
        else:
            for path in coll.get_paths():
                xy = coll.get_transform().transform(path.vertices)
                for a, b in zip(xy, xy[1:]):
                    pts.append(a + np.linspace(0, 1, SAMPLES_PER_SEGMENT)[:, None] * (b - a))
    if not pts:
        return np.empty((0, 2))
    xy = np.concatenate(pts)
    box = ax.get_window_extent()
    keep = np.all(np.isfinite(xy), axis=1) & (xy[:, 0] >= box.x0) & (xy[:, 0] <= box.x1) & \
        (xy[:, 1] >= box.y0) & (xy[:, 1] <= box.y1)
    return xy[keep]


def _bars(ax: Any, renderer: Any) -> list[Bbox]:
    """Display boxes of the bars (and other rectangles) ``ax`` draws, cut to the axes."""
    box = ax.get_window_extent()
    out = []
    for patch in ax.patches:
        if not isinstance(patch, Rectangle) or not patch.get_visible() or patch.get_width() == 0 \
                or patch.get_height() == 0:
            continue
        b = Bbox.intersection(patch.get_window_extent(renderer), box)
        if b is not None and b.width > TOL_PX and b.height > TOL_PX:
            out.append(b)
    return out


def layout_problems(fig: Any) -> list[str]:
    """Everything that makes ``fig`` hard to read, one line each: overlapping texts, texts cut off at the figure's
    edge, a legend over text, a legend over plotted data. Empty when the figure is readable."""
    fig.draw_without_rendering()  # the whole layout (constrained or tight) and every artist's extent, no pixels
    renderer = fig.canvas.get_renderer()
    texts = _shown_texts(fig)
    boxes = [(t, t.get_window_extent(renderer)) for t in texts]
    problems = []
    for i, (a, ba) in enumerate(boxes):
        for b, bb in boxes[i + 1:]:
            if _overlap(ba, bb):
                problems.append(f"text {a.get_text()!r} overlaps text {b.get_text()!r}")
    edge = fig.bbox
    for t, b in boxes:
        if b.x0 < edge.x0 - TOL_PX or b.y0 < edge.y0 - TOL_PX or b.x1 > edge.x1 + TOL_PX or b.y1 > edge.y1 + TOL_PX:
            problems.append(f"text {t.get_text()!r} is cut off at the figure's edge")
    for legend in _legends(fig):
        lb = legend.get_window_extent(renderer)
        own = {id(t) for t in legend.get_texts()} | {id(legend.get_title())}
        for t, b in boxes:
            if id(t) not in own and _overlap(lb, b):
                problems.append(f"a legend covers the text {t.get_text()!r}")
        for ax in fig.axes:
            xy = _data_points(ax)
            inside = (xy[:, 0] > lb.x0) & (xy[:, 0] < lb.x1) & (xy[:, 1] > lb.y0) & (xy[:, 1] < lb.y1)
            if inside.any():
                problems.append(f"a legend covers {int(inside.sum())} plotted points of the axes "
                                f"{ax.get_title()!r}")
            covered = [b for b in _bars(ax, renderer) if _overlap(lb, b)]
            if covered:
                problems.append(f"a legend covers {len(covered)} bars of the axes {ax.get_title()!r}")
    return problems


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

    return tc.bar_figure(tc.read_rows(RESULTS / "torta-runs-quick.csv"), keys, "TORTA")


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



def _replotted_figures(tmp_path_factory) -> dict[str, list[str]]:
    """Every figure the replottable experiments of results/README.md draw when redrawn from their committed files
    (``--replot`` into a copy of results/), each checked as it is saved: file name → its layout problems."""
    import contextlib
    import io
    import shutil

    from matplotlib.figure import Figure

    from petals_chain.experiments.__main__ import main
    from tests.experiments.test_readme_numbers import WITH_COMMAND, _replots

    argvs = [argv for argv in WITH_COMMAND.values() if _replots(argv)]
    out = tmp_path_factory.mktemp("replot") / "results"
    shutil.copytree(RESULTS, out)
    found: dict[str, list[str]] = {}
    save = Figure.savefig

    def checked_save(fig: Any, fname: Any, *args: Any, **kwargs: Any) -> Any:
        found[str(fname)] = layout_problems(fig)
        return save(fig, fname, *args, **kwargs)

    Figure.savefig = checked_save
    try:
        for argv in argvs:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                assert main([a for a in argv if a != "--replot"] + ["--replot", "--out", str(out)]) == 0, argv
    finally:
        Figure.savefig = save
    return {str(Path(f).relative_to(out)): problems for f, problems in found.items()}


def test_every_figure_a_replottable_experiment_draws_is_readable(tmp_path_factory) -> None:
    """Beyond the figures above: each one the experiments redraw from their files (fig5, fig6, torta-fig11, the
    Mell and TORTA figures, ...) passes the same checks."""
    found = _replotted_figures(tmp_path_factory)
    assert len(found) >= 20  # the walk really redrew the figures
    bad = {name: problems for name, problems in found.items() if problems}
    assert bad == {}, "; ".join(f"{n}: {', '.join(p[:3])}" for n, p in bad.items())
