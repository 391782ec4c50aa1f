"""TORTA's PPO layer put to the test: the trust region ``policy_trust`` at 0.15 (the default), 0.5 and 1.0, against
OT alone and RL without OT, with learning curves that say where the reward stops rising (docs/torta.md, "PPO
ablation").

``policy_trust`` bounds how far the learned allocation may move from its anchor, a smoothed OT plan
(‖A − anchor‖_F ≤ trust). At 0.15 the policy is hardly exercised. At 1.0 it may move the whole plan. For each topology
and evaluation seed, the policies are trained at every trust (the same seeds as the main comparison, so the rows pair
by seed) and evaluated on the same arrivals as TORTA, OT-only and RL-no-OT. The default trust's rows are the main
comparison's (torta-runs[-quick].csv, and its learning curves torta-train-TOPOLOGY.csv): only 0.5 and 1.0 are
trained here, on two topologies (:data:`TRUST_TOPOLOGIES`: at the full setting each (topology, trust) costs about
1.5 CPU-hours for 5 seeds). A full run keeps each finished seed (resumable per trust and topology); ``--quick`` is
the scaled quick setting. Output: torta-trust.csv (one row per topology, seed, trust and method),
torta-trust-curves.csv (the first seed's learning curve per topology and trust), torta-trust.png.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from petals_chain.experiments.common import (Summary, checkpoint_path, mean_ci, read_csv, replotting,
                                             save_figure, write_csv)
from petals_chain.experiments.torta_common import PAPER_NAME, EvalTask, RunSettings, read_rows, settings
from petals_chain.sim.montecarlo import run_replications

DEFAULT_TRUST = 0.15  # TortaParams' default: the main comparison's rows
TRUSTS = (DEFAULT_TRUST, 0.5, 1.0)
TRUST_TOPOLOGIES = ("abilene", "polska")
TOPOLOGIES = TRUST_TOPOLOGIES
METHODS = ("TORTA", "OT-only", "RL-no-OT")
REPLOT = True
NAME = "torta-trust"


def plateau_episode(rewards: list[float], share: float = 0.95) -> int:
    """The episode where the learning curve stops rising: the first at which its moving average (a tenth of the
    episodes wide, at least 3) has made ``share`` of its whole rise from the start to its maximum (0 if it never
    rises)."""
    r = np.asarray(rewards, dtype=float)
    if r.size == 0:
        return 0
    w = max(3, r.size // 10)
    smooth = np.convolve(r, np.ones(w) / w, mode="valid") if r.size >= w else r
    rise = smooth.max() - smooth[0]
    if not rise > 0:
        return 0
    return int(np.argmax(smooth >= smooth[0] + share * rise)) + (w - 1 if r.size >= w else 0)


def _rows_and_curves(args: Any, rs: RunSettings) -> tuple[list[dict], list[dict]]:
    """The default trust's rows and curves from the main comparison; every other (topology, trust) trained and
    evaluated over the seeds here."""
    if rs.params.policy_trust != DEFAULT_TRUST:
        raise ValueError(f"torta-trust: the main comparison's trust is {rs.params.policy_trust}, not {DEFAULT_TRUST}")
    main = read_rows(args.out / f"torta-runs{'-quick' if args.quick else ''}.csv")
    if not main:
        raise FileNotFoundError("torta-trust: run the main comparison first (torta-fig8"
                                f"{' --quick' if args.quick else ''} --seed {args.seed}): its rows are trust "
                                f"{DEFAULT_TRUST}'s")
    rows = [{**r, "trust": DEFAULT_TRUST} for r in main if r["topology"] in TOPOLOGIES and r["method"] in METHODS]
    curves = [{"topology": t, "trust": DEFAULT_TRUST, "episode": c["episode"], "mean_reward": c["mean_reward"]}
              for t in TOPOLOGIES for c in read_csv(args.out / f"torta-train-{t}.csv")]
    for topo in TOPOLOGIES:
        for trust in TRUSTS[1:]:
            rst = RunSettings(rs.slots, rs.seeds, rs.episodes, rs.params.with_(policy_trust=trust), rs.workers, rs.ray)
            task = EvalTask(topo, rst, args.seed, ((None, METHODS),))
            out = run_replications(task, rs.seeds, args.seed, workers=rs.workers, ray=rs.ray,
                                   desc=f"trust {trust:g} {topo}",
                                   checkpoint=checkpoint_path(f"{NAME}-{trust:g}-{topo}", args))
            for rep in out:
                rows += [{**r, "trust": trust} for r in rep["rows"]]
            curves += [{"topology": topo, "trust": trust, "episode": c["episode"], "mean_reward": c["mean_reward"]}
                       for c in out[0]["curve"]]
    return rows, curves


def run(args: Any) -> Summary:
    """Train, evaluate and report (or, with --replot, report from the saved CSVs)."""
    rs = settings(args)
    if replotting(args):
        rows, curves = read_csv(args.out / f"{NAME}.csv"), read_csv(args.out / f"{NAME}-curves.csv")
    else:
        rows, curves = _rows_and_curves(args, rs)
        write_csv(args.out / f"{NAME}.csv", rows)
        write_csv(args.out / f"{NAME}-curves.csv", curves)
    return _report(args, rows, curves, rs)


def _paired(rows: list[dict], topo: str, trust: float, method: str) -> tuple[float, float, float]:
    """TORTA at ``trust`` against ``method`` (at the same trust's run) on mean response: the mean per-seed
    difference TORTA − method in seconds with its 95 % half-width, and TORTA's mean."""
    def by_seed(m: str) -> dict[int, float]:
        return {int(float(r["seed"])): float(r["mean_response_s"]) for r in rows
                if r["topology"] == topo and float(r["trust"]) == trust and r["method"] == m}

    mine, other = by_seed("TORTA"), by_seed(method)
    seeds = sorted(set(mine) & set(other))
    diff, half = mean_ci([mine[s] - other[s] for s in seeds])
    return diff, half, float(np.mean([mine[s] for s in seeds])) if seeds else math.nan


def _report(args: Any, rows: list[dict], curves: list[dict], rs: RunSettings) -> Summary:
    lines = [f"{rs.seeds} seeds × {len(TOPOLOGIES)} topologies, {rs.episodes} PPO episodes, {rs.slots} slots; "
             "paired by seed, TORTA − other in mean response (s), 95 % CI; plateau = episode where the smoothed "
             "reward reaches 95 % of its rise"]
    beats = 0
    for topo in TOPOLOGIES:
        parts = []
        for trust in TRUSTS:
            d_ot, h_ot, mean = _paired(rows, topo, trust, "OT-only")
            d_rl, h_rl, _ = _paired(rows, topo, trust, "RL-no-OT")
            curve = [float(c["mean_reward"]) for c in curves if c["topology"] == topo and float(c["trust"]) == trust]
            if not math.isnan(h_ot) and d_ot + h_ot < 0:
                beats += 1
            parts.append(f"trust {trust:g}: TORTA {mean:.2f} s, vs OT-only {d_ot:+.2f} ± {h_ot:.2f}, vs RL-no-OT "
                         f"{d_rl:+.2f} ± {h_rl:.2f}, plateau at episode {plateau_episode(curve)} of {len(curve)}")
        lines.append(f"{PAPER_NAME[topo]}: " + "; ".join(parts))
    lines.append(f"TORTA faster than OT alone (paired CI below zero) in {beats} of {len(TOPOLOGIES) * len(TRUSTS)} "
                 "(topology, trust) cells")
    save_figure(_figure(rows, curves), args.out / f"{NAME}.png")
    command = f"python -m petals_chain.experiments torta-trust{' --quick' if args.quick else ''} --seed {args.seed}"
    return Summary(NAME, "TORTA: the PPO layer's trust region against OT alone", command, lines, [])


def _figure(rows: list[dict], curves: list[dict]):
    """Left: TORTA − OT-only per topology and trust (paired mean, 95 % CI). Right: the first seed's learning curves,
    one line per trust, for the first topology."""
    from petals_chain.experiments.common import figure

    fig, axes = figure(1, 2, figsize=(12, 4.2))
    ax, bx = axes[0]
    width = 0.8 / len(TRUSTS)
    for j, trust in enumerate(TRUSTS):
        st = [_paired(rows, t, trust, "OT-only") for t in TOPOLOGIES]
        ax.bar(np.arange(len(TOPOLOGIES)) + j * width, [s[0] for s in st], width,
               yerr=[0 if math.isnan(s[1]) else s[1] for s in st], capsize=2, label=f"trust {trust:g}")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(np.arange(len(TOPOLOGIES)) + 0.4 - width / 2, [PAPER_NAME[t] for t in TOPOLOGIES])
    ax.set_ylabel("TORTA − OT-only, mean response (s)")
    ax.grid(axis="x", visible=False)
    topo = TOPOLOGIES[0]
    for trust in TRUSTS:
        c = [(int(x["episode"]), float(x["mean_reward"])) for x in curves
             if x["topology"] == topo and float(x["trust"]) == trust]
        if c:
            bx.plot(*zip(*c), label=f"trust {trust:g}")
    bx.set_xlabel("episode")
    bx.set_ylabel(f"mean reward per slot ({PAPER_NAME[topo]}, first seed)")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=len(TRUSTS), frameon=False)
    fig.suptitle("TORTA's PPO layer: trust region against OT alone")
    return fig
