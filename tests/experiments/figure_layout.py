"""The layout checker behind tests/experiments/test_plots_readable.py: what makes a figure hard to read.

A figure is laid out by matplotlib (``fig.draw_without_rendering()``: the draw of ``fig.canvas.draw()`` without the
pixels); then every text artist's window extent is compared with every other's and with each legend's, and each
legend's extent with the display coordinates of the plotted lines, markers, bars and shaded areas.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.collections import PathCollection
from matplotlib.legend import Legend
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from matplotlib.transforms import Bbox

TOL_PX = 1.0  # boxes that share less than a pixel in either direction do not overlap
SAMPLES_PER_SEGMENT = 16  # points checked along each drawn line segment


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
