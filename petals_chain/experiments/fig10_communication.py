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
from petals_chain.experiments.common import Summary, plt, save_figure, write_csv
from petals_chain.experiments.fig9_computation import KIND_COLOURS, load_for
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


def draw(path: Path, fit_data: dict[str, list[pf.Point]], paper_data: dict[str, list[pf.Point]],
         fits: dict[str, ServerFit], errors: dict[str, pf.PanelError], base: tuple[int, int]) -> Path:
    """Three panels; measured points by kind (circles first token, squares the rest), fit solid, paper dashed."""
    pyplot = plt()
    kinds = pf.kind_of(fits)
    fig, axes = pyplot.subplots(1, 3, figsize=(15, 4.6))
    markers = {"first": "o", "rest": "s", "job": "^"}
    for ax, axis in zip(axes, ("output", "input", "blocks")):
        keys = [k for k in fit_data if k.endswith(f"@ {axis}")]
        for key in keys:
            series = key.split(" @ ")[0]
            for kind in ("high end", "low end"):
                pts = [p for p in fit_data[key] if kinds[p.server] == kind]
                if not pts:
                    continue
                ax.scatter([p.x for p in pts], [p.measured_s for p in pts], s=14, marker=markers[series],
                           color=KIND_COLOURS[kind], alpha=0.5, label=f"{series}, measured, {kind}")
                xs = sorted({p.x for p in pts})
                for data, ls, what in ((fit_data, "-", "fit"), (paper_data, "--", "paper model")):
                    mine = [p for p in data[key] if kinds[p.server] == kind]
                    ax.plot(xs, [np.mean([p.model_s for p in mine if p.x == x]) for x in xs], ls=ls, lw=1,
                            color=KIND_COLOURS[kind], label=f"{series}, {what}, {kind}")
        err = "; ".join(f"{k.split(' @ ')[0]}: fit {100 * errors[k].rel_rmse:.0f} %" for k in keys)
        xl = {"output": f"output length l_out (m=L, l_in={base[0]})", "input": f"input length l_in (m=L, "
              f"l_out={base[1]})", "blocks": f"blocks m (l_in={base[0]}, l_out={base[1]})"}[axis]
        ax.set(xlabel=xl, ylabel="communication (s)", title=f"vs {axis}\nrel. RMSE {err}")
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle("Fig 10 on the CPU-emulated testbed: communication = step time − fitted computation "
                 "(first token: the prefill step; rest: the decode steps)", fontsize=10)
    return save_figure(fig, path)


def run(args: Any) -> Summary:
    """Read the profile, compute the series and their errors against both models, plot, summarise."""
    profile, samples, base, where = load_for(args)
    fit_data = panels(samples, profile.fits, profile.num_blocks, base)
    paper_data = panels(samples, profile.fits, profile.num_blocks, base, paper_model=True)
    errors = {k: pf.panel_error(v) for k, v in fit_data.items()}
    paper_errors = {k: pf.panel_error(v) for k, v in paper_data.items()}
    kinds = pf.kind_of(profile.fits)
    write_csv(args.out / "fig10.csv", [
        {"series": k, "server": p.server, "kind": kinds[p.server], "x": p.x, "measured_s": p.measured_s,
         "fit_model_s": p.model_s, "paper_model_s": q.model_s}
        for k in fit_data for p, q in zip(fit_data[k], paper_data[k])])
    draw(args.out / "fig10.png", fit_data, paper_data, profile.fits, errors, base)
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
