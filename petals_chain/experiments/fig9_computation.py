"""Fig. 9 measured on the CPU-emulated testbed: computation time vs blocks, input length and output length.

From the committed profile's step samples (``results/profile/STEM_samples.csv``, made by
``python -m petals_chain.launch.profile_testbed``), with the fitted model drawn over them and its error printed per
panel. What is measured and what is inferred: petals_chain.experiments.profile_figs. Writes fig9.csv (every
point with the model's value), fig9.png.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.experiments import profile_figs as pf
from petals_chain.experiments.common import REPO, Summary, figure, save_figure, write_csv
from petals_chain.launch.profile_fit import FULL_GRID, ServerFit, StepSample
from petals_chain.model import SpecError

DEFAULT_STEM = REPO / "results" / "profile" / "cpu-emulated-regime-full"  # all 9 servers, full grid, quiet machine
KIND_COLOURS = {"high end": "tab:blue", "low end": "tab:orange"}
PAPER = ["computation time grows linearly with the number of blocks a server runs",
         "prefill time grows linearly with the input length; decode time linearly with the output length"]


def scatter_nonnegative(ax: Any, xs: Sequence[float], ys: Sequence[float], colour: Any, **kw: Any) -> int:
    """Scatter inferred times (a step time minus a fitted part): values below 0 s, where the run-to-run noise of
    the step exceeds the part inferred, are drawn at 0 s as open downward triangles instead of below the axis as if
    a negative time had been measured; returns how many there were (for the caption)."""
    pos = [(x, y) for x, y in zip(xs, ys) if y >= 0]
    neg = [x for x, y in zip(xs, ys) if y < 0]
    ax.scatter([x for x, _ in pos], [y for _, y in pos], color=colour, **kw)
    if neg:
        ax.scatter(neg, [0.0] * len(neg), s=22, marker="v", facecolors="none", edgecolors=colour, clip_on=False)
    return len(neg)


def load_stem(stem: Path = DEFAULT_STEM) -> tuple[Any, list[StepSample]]:
    """The profile (fits) and its step samples; SpecError naming the file if either is missing."""
    from petals_chain.launch.profile_results import load_profile, read_samples_csv

    samples_path = Path(f"{stem}_samples.csv")
    if not samples_path.is_file():
        raise SpecError(f"{samples_path}: no profile samples "
                        "(python -m petals_chain.launch.profile_testbed TESTBED.yaml)")
    return load_profile(Path(f"{stem}.json")), read_samples_csv(samples_path)


def load_for(args: Any) -> tuple[Any, list[StepSample], tuple[int, int], str]:
    """The profile ``args.profile_stem`` names (default: the one measured last), its samples, the grid's base job
    and the stem as the summary names it (relative to the repository when inside it)."""
    stem = Path(getattr(args, "profile_stem", None) or DEFAULT_STEM)
    profile, samples = load_stem(stem)
    where = str(stem.relative_to(REPO) if stem.is_relative_to(REPO) else stem)
    return profile, samples, (FULL_GRID.base_input, FULL_GRID.base_output), where


def panels(samples: Sequence[StepSample], fits: dict[str, ServerFit], num_blocks: int,
           base: tuple[int, int] = (FULL_GRID.base_input, FULL_GRID.base_output)) -> dict[str, list[pf.Point]]:
    """Fig 9's three panels: computation of a job vs m, prefill vs l_in, decode vs l_out (all L blocks)."""
    return {"blocks": pf.computation_vs_blocks(samples, fits, base),
            "input": pf.prefill_vs_input(samples, fits, num_blocks, base[1]),
            "output": pf.decode_vs_output(samples, fits, num_blocks, base[0])}


def draw(path: Path, data: dict[str, list[pf.Point]], fits: dict[str, ServerFit], errors: dict[str, pf.PanelError],
         base: tuple[int, int], num_blocks: int) -> Path:
    """Three panels: points coloured by server kind, the fit's line per server."""
    kinds = pf.kind_of(fits)
    fig, axes = figure(1, 3, figsize=(15, 5.0))
    axes = axes[0]
    negative = 0
    labels = {"blocks": (f"blocks m (l_in={base[0]}, l_out={base[1]})", "computation of one job (s)",
                         "(a) computation vs blocks"),
              "input": (f"input length l_in (m={num_blocks})", "prefill computation (s)",
                        "(b) prefill vs input length"),
              "output": (f"output length l_out (m={num_blocks}, l_in={base[0]})", "decode computation of a job (s)",
                         "(c) decode vs output length")}
    for ax, (key, pts) in zip(axes, data.items()):
        seen = set()
        for name in fits:
            mine = sorted((p for p in pts if p.server == name), key=lambda p: p.x)
            if not mine:
                continue
            k = kinds[name]
            negative += scatter_nonnegative(ax, [p.x for p in mine], [p.measured_s for p in mine], KIND_COLOURS[k],
                                            s=12, alpha=0.6, label=f"measured, {k}" if k not in seen else None)
            xs = sorted({p.x for p in mine})
            model = [np.mean([p.model_s for p in mine if p.x == x]) for x in xs]
            ax.plot(xs, model, color=KIND_COLOURS[k], lw=1, alpha=0.8,
                    label=f"fitted model, {k}" if k not in seen else None)
            seen.add(k)
        xl, yl, title = labels[key]
        ax.set(xlabel=xl, ylabel=yl, title=f"{title}\nrel. RMSE {100 * errors[key].rel_rmse:.0f} %, "
                                           f"max {100 * errors[key].max_rel_error:.0f} %")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(f"Fig 9 on the CPU-emulated testbed (SmolLM2-135M, {len(fits)} servers): computation = step "
                 "time − fitted round trip", fontsize=10)
    if negative:
        fig.supxlabel(f"{negative} inferred values are below 0 s (the step's noise exceeds the computation there); "
                      "they are drawn at 0 s as open triangles", fontsize=8)
    return save_figure(fig, path)


def run(args: Any) -> Summary:
    """Read the profile, compute the panels and their errors, plot, summarise next to the paper."""
    profile, samples, base, where = load_for(args)
    data = panels(samples, profile.fits, profile.num_blocks, base)
    errors = {k: pf.panel_error(v) for k, v in data.items()}
    kinds = pf.kind_of(profile.fits)
    write_csv(args.out / "fig9.csv", [{"panel": k, "server": p.server, "kind": kinds[p.server], "x": p.x,
                                       "measured_s": p.measured_s, "model_s": p.model_s}
                                      for k, pts in data.items() for p in pts])
    draw(args.out / "fig9.png", data, profile.fits, errors, base, profile.num_blocks)
    names = {"blocks": "computation vs blocks", "input": "prefill vs input length", "output": "decode vs output length"}
    lines = [f"{names[k]}: {errors[k].describe()}" for k in data]
    lines += [f"{names[k]}: a straight line through the measured points has R² {pf.line_r2(data[k]):.3f}" for k in data]
    ratios = []
    for k in data:
        slopes = {}
        for kind in ("high end", "low end"):
            pts = [p for p in data[k] if kinds[p.server] == kind]
            if pts:
                slopes[kind] = pf.slope(pts)
                lines.append(f"{names[k]}, {kind}: measured slope {slopes[kind] * 1e3:.3f} ms per unit of x")
        if len(slopes) == 2 and slopes["high end"] > 0:
            ratios.append(slopes["low end"] / slopes["high end"])
    lines.append(f"profile {where}: {profile.command} "
                 f"({profile.created}); measured = client-side step times, computation inferred by subtracting the "
                 "per-server fitted round trip (the intercept over block counts), see petals_chain/experiments/"
                 "profile_figs.py")
    spread = f"{min(ratios):.2f}-{max(ratios):.2f} x the high-end's" if ratios else "not measured"
    lines.append("Why it differs from the paper: the shapes agree (linear in blocks, in input length for the prefill, "
                 "in output length for the decode); the scatter is this 2-core machine's, where every server's "
                 "steps share the cores with the others' and with the client; the low-end stand-ins' slopes are "
                 f"{spread} (their speed is emulated by a sleep of (1/f - 1) x the CPU time each call used, so a "
                 "loaded machine narrows the ratio)")
    command = f"python -m petals_chain.experiments fig9{' --quick' if getattr(args, 'quick', False) else ''}"
    return Summary("fig9", "computation time vs blocks, input and output length (profile of the emulated testbed)",
                   command, lines, PAPER, {"errors": {k: vars(e) for k, e in errors.items()}})
