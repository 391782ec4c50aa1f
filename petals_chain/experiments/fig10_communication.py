"""Fig. 10 measured on the CPU-emulated testbed: communication of the first token and of the rest, vs output and
input length (and vs blocks, which the paper says it does not depend on).

From the committed profile's step samples, like Fig 9 (petals_chain.experiments.fig9_computation); the
split of a step into computation and communication is explained in petals_chain.experiments.profile_figs.
Two model lines: the per-server fit (r + s for the first token, (l_out − 1)·r after it) and the paper's
``RTT + 18 ms`` per round trip. Writes fig10.csv and fig10.png.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.experiments import profile_figs as pf
from petals_chain.experiments.common import Summary, save_figure, write_csv
from petals_chain.experiments.fig9_computation import KIND_COLOURS, load_for, scatter_nonnegative
from petals_chain.launch.profile_fit import FULL_GRID, ServerFit, StepSample

PAPER = ["communication time does not depend on the GPU type or the number of blocks",
         "communication after the first token grows with the output length; the first token's grows only weakly "
         "with the input length"]
SERIES = ("first", "rest")


def panels(samples: Sequence[StepSample], fits: dict[str, ServerFit], num_blocks: int,
           base: tuple[int, int] = (FULL_GRID.base_input, FULL_GRID.base_output),
           paper_model: bool = False) -> dict[str, list[pf.Point]]:
    """Series 'first|rest @ output|input' (all L blocks) and 'job @ blocks', with the fit's or the paper's model."""
    out = {}
    for axis in ("output", "input"):
        kw = {"num_blocks": num_blocks, "axis": axis, "base": base, "paper_model": paper_model}
        out[f"first @ {axis}"] = pf.first_token_comm(samples, fits, **kw)
        out[f"rest @ {axis}"] = pf.rest_comm(samples, fits, **kw)
    job = pf.comm_vs_blocks(samples, fits, base)
    if paper_model:
        job = [pf.Point(p.server, p.x, p.measured_s, fits[p.server].model_tau_c_s(base[1])) for p in job]
    out["job @ blocks"] = job
    return out


def csv_rows(fit_data: dict[str, list[pf.Point]], paper_data: dict[str, list[pf.Point]],
             kinds: dict[str, str]) -> list[dict[str, Any]]:
    """fig10.csv's rows: one per measured point, with the fit's and the paper's model next to it."""
    return [{"series": k, "server": p.server, "kind": kinds[p.server], "x": p.x, "measured_s": p.measured_s,
             "fit_model_s": p.model_s, "paper_model_s": q.model_s}
            for k in fit_data for p, q in zip(fit_data[k], paper_data[k])]


def figure(rows: Sequence[dict[str, Any]], base: tuple[int, int]):
    """Three panels (vs output, input, blocks) from fig10.csv's rows: measured points by server kind (colour) and
    series (marker: first token, the rest, the whole job), the per-server fit solid, the paper's model dashed.

    Communication is inferred (step time − fitted computation) and comes out below 0 where the computation's
    noise is larger than the round trip: such points are drawn at 0 as open downward triangles and counted in
    the caption, never below the axis as if a negative time had been measured."""
    from matplotlib.lines import Line2D

    from petals_chain.experiments.common import figure as new_figure

    fig, axes = new_figure(1, 3, figsize=(15, 5.2))
    markers = {"first": "o", "rest": "s", "job": "^"}
    names = {"first": "first token", "rest": "the rest", "job": "whole job"}
    negative = 0
    for ax, axis in zip(axes[0], ("output", "input", "blocks")):
        keys = list(dict.fromkeys(r["series"] for r in rows if r["series"].endswith(f"@ {axis}")))
        errs = []
        for key in keys:
            series = key.split(" @ ")[0]
            mine = [r for r in rows if r["series"] == key]
            pts = [pf.Point(r["server"], r["x"], r["measured_s"], r["fit_model_s"]) for r in mine]
            errs.append(f"{names[series]} {100 * pf.panel_error(pts).rel_rmse:.0f} %")
            for kind in ("high end", "low end"):
                kr = [r for r in mine if r["kind"] == kind]
                if not kr:
                    continue
                colour = KIND_COLOURS[kind]
                negative += scatter_nonnegative(ax, [r["x"] for r in kr], [r["measured_s"] for r in kr], colour,
                                                s=14, marker=markers[series], alpha=0.5)
                xs = sorted({r["x"] for r in kr})
                for col, ls in (("fit_model_s", "-"), ("paper_model_s", "--")):
                    ax.plot(xs, [np.mean([r[col] for r in kr if r["x"] == x]) for x in xs], ls=ls, lw=1.2,
                            color=colour)
        xl = {"output": f"output length l_out (m=L, l_in={base[0]})", "input": f"input length l_in (m=L, "
              f"l_out={base[1]})", "blocks": f"blocks m (l_in={base[0]}, l_out={base[1]})"}[axis]
        ax.set(xlabel=xl, ylabel="communication (s)", title=f"vs {axis}\nfit's rel. RMSE: {'; '.join(errs)}")
        ax.set_ylim(bottom=0)
    handles = [Line2D([], [], ls="", marker="s", ms=8, color=c, label=k) for k, c in KIND_COLOURS.items()]
    handles += [Line2D([], [], ls="", marker=m, color="gray", alpha=0.7, label=f"measured, {names[s]}")
                for s, m in markers.items()]
    handles += [Line2D([], [], ls="-", color="gray", label="per-server fit"),
                Line2D([], [], ls="--", color="gray", label="paper's model (RTT + 18 ms per round trip)"),
                Line2D([], [], ls="", marker="v", mfc="none", color="gray", label="inferred below 0 s, drawn at 0")]
    fig.legend(handles=handles, loc="outside upper center", ncol=5, frameon=False, fontsize=9)
    fig.supxlabel("Fig 10 on the CPU-emulated testbed: communication = step time − fitted computation (first token: "
                  "the prefill step; the rest: the decode steps).\n"
                  f"{negative} of {len(rows)} inferred values are below 0 s (the computation's run-to-run noise "
                  "exceeds the round trip there); they are drawn at 0 s as open triangles.", fontsize=9)
    return fig


def draw(path: Path, rows: Sequence[dict[str, Any]], base: tuple[int, int]) -> Path:
    """Draw :func:`figure` to ``path`` (fig10.png)."""
    return save_figure(figure(rows, base), path)


def run(args: Any) -> Summary:
    """Read the profile, compute the series and their errors against both models, plot, summarise."""
    profile, samples, base, where = load_for(args)
    fit_data = panels(samples, profile.fits, profile.num_blocks, base)
    paper_data = panels(samples, profile.fits, profile.num_blocks, base, paper_model=True)
    errors = {k: pf.panel_error(v) for k, v in fit_data.items()}
    paper_errors = {k: pf.panel_error(v) for k, v in paper_data.items()}
    kinds = pf.kind_of(profile.fits)
    rows = csv_rows(fit_data, paper_data, kinds)
    write_csv(args.out / "fig10.csv", rows)
    draw(args.out / "fig10.png", rows, base)
    lines = []
    for k in fit_data:
        lines.append(f"{k}: fit: {errors[k].describe()}")
        lines.append(f"{k}: paper's RTT + 18 ms: {paper_errors[k].describe()}")
    for k in fit_data:
        for kind in ("high end", "low end"):
            pts = [p for p in fit_data[k] if kinds[p.server] == kind]
            if pts:
                lines.append(f"{k}, {kind}: mean {np.mean([p.measured_s for p in pts]):.3f} s, measured slope "
                             f"{pf.slope(pts) * 1e3:.2f} ms per unit of x")
    share = pf.decode_comm_share(samples, profile.fits, profile.num_blocks)
    lines.append(f"the fitted round trip is {100 * share:.0f} % of a measured decode step on all {profile.num_blocks} "
                 "blocks: where it is small, the computation's run-to-run noise is as large as the communication, so "
                 "the inferred communication scatters (even below 0) and the errors above are large; the paper's "
                 "GPU testbed, where a step is mostly communication, separates the two far better")
    lines.append(f"profile {where}: {profile.command} "
                 f"({profile.created}); measured = client-side step times, communication inferred by subtracting the "
                 "per-server fitted computation, see petals_chain/experiments/profile_figs.py")
    command = f"python -m petals_chain.experiments fig10{' --quick' if getattr(args, 'quick', False) else ''}"
    return Summary("fig10", "communication time (first token vs the rest) vs output and input length, emulated testbed",
                   command, lines, PAPER, {"errors": {k: vars(e) for k, e in errors.items()},
                                           "paper_model_errors": {k: vars(e) for k, e in paper_errors.items()}})
