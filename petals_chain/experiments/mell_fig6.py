"""Mell Fig. 6 (Finding 3): requests a fixed pool of GPUs holds with and without migration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from petals_chain.experiments.common import Summary, mean_ci, read_csv, replotting, save_figure, write_csv
from petals_chain.experiments.mell_common import SETTINGS, WORKLOADS, command, config, scale, workload
from petals_chain.experiments.paper import run_seeds
from petals_chain.mell.serving import serve_fixed

POOL = 8  # GPUs in the fixed pool


REPLOT = True  # `--replot` redraws mell_fig6.png and its summary from results/mell_fig6.csv


def run(args) -> Summary:
    """Serve the same arrivals on POOL GPUs with and without migration for each setting and workload (the three
    Poisson rates and the Azure arrivals)."""
    if replotting(args):
        return _report(args, saved_rows(args.out))
    sc = scale(args.quick)
    horizon_s = 400.0 if args.quick else 1200.0
    rows = []
    cells = [(s, w) for s in SETTINGS for w in WORKLOADS]
    for s, w in tqdm(cells, desc="mell fig6", unit="cell"):
        cfg = config(s)
        for r, rng in enumerate(run_seeds(args.seed, sc.runs)):
            wl = workload(w, s, 4 * sc.requests, rng)
            for mig in (False, True):
                res = serve_fixed(wl, POOL, cfg.capacity_tokens, migrate=mig, tokens_per_slot=cfg.tokens_per_slot,
                                  slot_s=cfg.slot_s, horizon_s=horizon_s)
                rows.append({"setting": s, "workload": w, "run": r, "migration": mig,
                             "mean_running": res.mean_running, "completed": res.completed,
                             "preemptions": res.preemptions, "migrations": res.migrations})
    write_csv(args.out / "mell_fig6.csv", rows)
    return _report(args, rows)


def saved_rows(out: Path) -> list[dict]:
    """mell_fig6.csv read back with its integer and boolean columns as such."""
    rows = read_csv(out / "mell_fig6.csv")
    for r in rows:
        r.update({"run": int(r["run"]), "migration": r["migration"] == "True", "completed": int(r["completed"]),
                  "preemptions": int(r["preemptions"]), "migrations": int(r["migrations"])})
    return rows


def _cells(rows: list[dict]) -> list[tuple[str, str]]:
    """(setting, workload) pairs in the order the rows have them."""
    return list(dict.fromkeys((r["setting"], r["workload"]) for r in rows))


def gain_ci(rows: list[dict], s: str, w: str) -> tuple[float, float]:
    """Per cent more requests held with migration than without, and the 95 % half-width of that gain over the
    runs (paired: both arms of a run serve the same arrivals)."""
    by = {(r["run"], r["migration"]): r["mean_running"] for r in rows if r["setting"] == s and r["workload"] == w}
    runs = sorted({k for k, _ in by})
    ratios = [100 * (by[(k, True)] / by[(k, False)] - 1) for k in runs if (k, True) in by and (k, False) in by]
    return mean_ci(ratios)


def fig6_figure(rows: list[dict]):
    """Requests held (mean over runs, 95 % interval) without and with migration per setting and rate; the paired
    gain with its interval written above each pair; the legend outside the bars."""
    from petals_chain.experiments.common import figure

    fig, axes = figure(figsize=(9, 4.8))
    ax = axes[0][0]
    cells = _cells(rows)
    runs = len({r["run"] for r in rows})
    for k, (s, w) in enumerate(cells):
        v = {m: mean_ci([x["mean_running"] for x in rows if x["setting"] == s and x["workload"] == w
                         and x["migration"] == m]) for m in (False, True)}
        for m, dx, colour, label in ((False, -0.2, "tab:grey", "without migration"),
                                     (True, 0.2, "tab:blue", "with migration")):
            ax.bar(k + dx, v[m][0], 0.4, yerr=0 if np.isnan(v[m][1]) else v[m][1], capsize=3, color=colour,
                   label=label if k == 0 else None)
        gain, half = gain_ci(rows, s, w)
        top = max(v[m][0] + (0 if np.isnan(v[m][1]) else v[m][1]) for m in v)
        ax.text(k, top + 0.5, f"{gain:+.0f} %" + ("" if np.isnan(half) else f"\n± {half:.0f}"), ha="center",
                va="bottom", fontsize=8)
    ax.set_xticks(range(len(cells)), [f"{s}\n{w}" for s, w in cells], fontsize=8)
    ax.grid(axis="x", visible=False)
    ax.set_ylim(0, 1.2 * max(r["mean_running"] for r in rows))
    ax.set_ylabel(f"requests held in KV cache (mean, {POOL} GPUs)")
    ax.set_title(f"Mell Fig. 6: a fixed GPU pool with and without migration\n({runs} runs per bar, whiskers 95 % "
                 "interval; above: the paired gain and its interval)")
    fig.legend(loc="outside lower center", ncol=2, frameon=False)
    return fig


def _report(args, rows: list[dict]) -> Summary:
    """The figure and the summary lines (gain per cell) from the rows."""
    lines, gains = [], []
    for s, w in _cells(rows):
        v = {m: mean_ci([x["mean_running"] for x in rows if x["setting"] == s and x["workload"] == w
                         and x["migration"] == m]) for m in (False, True)}
        done = {m: mean_ci([x["completed"] for x in rows if x["setting"] == s and x["workload"] == w
                            and x["migration"] == m])[0] for m in (False, True)}
        gain = 100 * (v[True][0] / v[False][0] - 1)
        gains.append(gain)
        lines.append(f"{s} {w}: {v[False][0]:.1f} → {v[True][0]:.1f} requests held ({gain:+.1f} %); "
                     f"completed {done[False]:.0f} → {done[True]:.0f}")
    save_figure(fig6_figure(rows), args.out / "mell_fig6.png")
    lines.append(f"gain range {min(gains):.1f} to {max(gains):.1f} %")
    return Summary("mell_fig6", "Mell: requests served with vs without migration", command("mell-fig6", args),
                   lines, ["migration lets the system hold 23–60 % more requests"], {"gains": gains})
