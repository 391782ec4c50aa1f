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
ARMS = ((False, False), (False, True), (True, False))  # (migration, reserve): preempting, reserving, migrating


REPLOT = True  # `--replot` redraws mell_fig6.png and its summary from results/mell_fig6.csv


def run(args) -> Summary:
    """Serve the same arrivals on POOL GPUs with and without migration for each setting and workload (the three
    Poisson rates and the Azure arrivals). Without migration in both of Fig 11's flavours: preempting on
    overflow (the default pool) and reserving each request's final size at admission."""
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
            for mig, reserve in ARMS:
                res = serve_fixed(wl, POOL, cfg.capacity_tokens, migrate=mig, tokens_per_slot=cfg.tokens_per_slot,
                                  slot_s=cfg.slot_s, horizon_s=horizon_s, reserve=reserve)
                rows.append({"setting": s, "workload": w, "run": r, "migration": mig, "reserve": reserve,
                             "mean_running": res.mean_running, "completed": res.completed,
                             "preemptions": res.preemptions, "migrations": res.migrations})
    write_csv(args.out / "mell_fig6.csv", rows)
    return _report(args, rows)


def saved_rows(out: Path) -> list[dict]:
    """mell_fig6.csv read back with its integer and boolean columns as such."""
    rows = read_csv(out / "mell_fig6.csv")
    for r in rows:
        r.update({"run": int(r["run"]), "migration": r["migration"] == "True",
                  "reserve": r.get("reserve", "False") == "True", "completed": int(r["completed"]),
                  "preemptions": int(r["preemptions"]), "migrations": int(r["migrations"])})
    return rows


def _cells(rows: list[dict]) -> list[tuple[str, str]]:
    """(setting, workload) pairs in the order the rows have them."""
    return list(dict.fromkeys((r["setting"], r["workload"]) for r in rows))


def _arm(r: dict) -> str:
    """The row's pool: ``migrate``, ``preempt`` (no migration, the default) or ``reserve``."""
    return "migrate" if r["migration"] else "reserve" if r.get("reserve") else "preempt"


def _held(rows: list[dict], s: str, w: str, arm: str, col: str = "mean_running") -> tuple[float, float]:
    """Mean and 95 % half-width of ``col`` over the runs of one arm in one cell."""
    return mean_ci([x[col] for x in rows if x["setting"] == s and x["workload"] == w and _arm(x) == arm])


def gain_ci(rows: list[dict], s: str, w: str, against: str = "preempt") -> tuple[float, float]:
    """Per cent more requests held with migration than by the pool ``against`` without it, and the 95 %
    half-width of that gain over the runs (paired: every arm of a run serves the same arrivals)."""
    by = {(r["run"], _arm(r)): r["mean_running"] for r in rows if r["setting"] == s and r["workload"] == w}
    runs = sorted({k for k, _ in by})
    ratios = [100 * (by[(k, "migrate")] / by[(k, against)] - 1) for k in runs
              if (k, "migrate") in by and (k, against) in by]
    return mean_ci(ratios)


ARM_STYLE = (("reserve", "tab:olive", "r: without migration, reserving the final size"),
             ("preempt", "tab:grey", "p: without migration, preempting on overflow"),
             ("migrate", "tab:blue", "with migration"))


def fig6_figure(rows: list[dict]):
    """Requests held (mean over runs, 95 % interval) by each pool per setting and rate; the paired gain of
    migration over the preempting pool (and over the reserving one, where the rows have it) above each group."""
    from petals_chain.experiments.common import figure

    fig, axes = figure(figsize=(10, 5))
    ax = axes[0][0]
    cells = _cells(rows)
    runs = len({r["run"] for r in rows})
    arms = [a for a in ARM_STYLE if any(_arm(r) == a[0] for r in rows)]
    width = 0.8 / len(arms)
    for k, (s, w) in enumerate(cells):
        v = {a: _held(rows, s, w, a) for a, _, _ in arms}
        for i, (a, colour, label) in enumerate(arms):
            ax.bar(k + (i - (len(arms) - 1) / 2) * width, v[a][0], width, capsize=2, color=colour,
                   yerr=0 if np.isnan(v[a][1]) else v[a][1], label=label if k == 0 else None)
        text = []
        for against, tag in (("preempt", "p"), ("reserve", "r")):
            if against in v:
                gain, half = gain_ci(rows, s, w, against)
                text.append(f"{tag} {gain:+.0f}" + ("" if np.isnan(half) else f"±{half:.0f}") + " %")
        top = max(m + (0 if np.isnan(h) else h) for m, h in v.values())
        ax.text(k, top + 0.5, "\n".join(text), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(cells)), [f"{s}\n{w}" for s, w in cells], fontsize=8)
    ax.grid(axis="x", visible=False)
    ax.set_ylim(0, 1.3 * max(r["mean_running"] for r in rows))
    ax.set_ylabel(f"requests held in KV cache (mean, {POOL} GPUs)")
    ax.set_title(f"Mell Fig. 6: a fixed GPU pool with and without migration\n({runs} runs per bar, 95 % whiskers; "
                 "above: migration's paired gain over pools p and r)")
    fig.legend(loc="outside lower center", ncol=len(arms), frameon=False)
    return fig


def _report(args, rows: list[dict]) -> Summary:
    """The figure and the summary lines (gain per cell, over each pool without migration) from the rows."""
    lines, gains, reserve_gains = [], [], []
    for s, w in _cells(rows):
        v = {a: _held(rows, s, w, a)[0] for a in ("preempt", "reserve", "migrate")}
        done = {a: _held(rows, s, w, a, "completed")[0] for a in ("preempt", "reserve", "migrate")}
        gain = 100 * (v["migrate"] / v["preempt"] - 1)
        gains.append(gain)
        line = (f"{s} {w}: {v['preempt']:.1f} → {v['migrate']:.1f} requests held ({gain:+.1f} %); "
                f"completed {done['preempt']:.0f} → {done['migrate']:.0f}")
        if not np.isnan(v["reserve"]):
            reserve_gains.append(100 * (v["migrate"] / v["reserve"] - 1))
            line += (f"; against the reserving pool {v['reserve']:.1f} → {v['migrate']:.1f} "
                     f"({reserve_gains[-1]:+.1f} %)")
        lines.append(line)
    save_figure(fig6_figure(rows), args.out / "mell_fig6.png")
    lines.append(f"gain range {min(gains):.1f} to {max(gains):.1f} % (against the preempting pool)")
    if reserve_gains:
        lines.append(f"gain range {min(reserve_gains):.1f} to {max(reserve_gains):.1f} % against the reserving pool "
                     "(no migration, each request's final size held from admission)")
    return Summary("mell_fig6", "Mell: requests served with vs without migration", command("mell-fig6", args),
                   lines, ["migration lets the system hold 23–60 % more requests"],
                   {"gains": gains, "reserve_gains": reserve_gains})
