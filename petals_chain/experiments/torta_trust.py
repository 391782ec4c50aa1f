"""TORTA's PPO layer put to the test: the trust region ``policy_trust`` at 0.15 (the default), 0.5 and 1.0, against
OT alone and RL without OT, with the learning curve that says where the reward stops rising
(docs/torta.md, "PPO ablation").

``policy_trust`` bounds, at decision time, how far the learned allocation may move from its anchor, a smoothed OT
plan (‖A − anchor‖_F ≤ trust; torta/episode.py). PPO trains without it, so one training serves every trust: for
each topology of :data:`TRUST_TOPOLOGIES` and each evaluation seed, the shared evaluation
(``torta_common.shared_evaluation``, the same training as the main comparison and Fig 12) evaluates TORTA at every
trust beside OT-only and RL-no-OT on the same arrivals; a full run resumes from its per-seed checkpoint.
``--quick`` is the scaled quick setting. Output: torta-trust.csv (one row per topology, seed, trust and method;
OT-only and RL-no-OT once per seed, under every trust for the pairing), torta-trust-curves.csv (every seed's
learning curve per topology), torta-trust.png.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from petals_chain.experiments.common import (Summary, mean_ci, read_csv, replotting,
                                             save_figure, write_csv)
from petals_chain.experiments.torta_common import (PAPER_NAME, TRUST_TOPOLOGIES, TRUSTS, RunSettings,
                                                   anchor_evaluation, main_rows, select_rows, settings,
                                                   shared_evaluation, shared_evaluations)

METHODS = ("TORTA", "OT-only", "RL-no-OT")
ANCHOR_METHODS = ("anchor", "OT-only (anchor run)")  # torta_common.AnchorTask's rows
TOPOLOGIES = TRUST_TOPOLOGIES
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
    """Every trust topology's seeds from the shared evaluation (one training per seed serves the main comparison,
    Fig 12 and this ablation): TORTA at each trust, and OT-only and RL-no-OT repeated under every trust for the
    pairing; every seed's learning curve."""
    rows, curves = [], []
    shared_evaluations(TOPOLOGIES, args, rs)  # every topology's seeds in one pool or on Ray at once
    for topo in TOPOLOGIES:
        shared, every_curve = shared_evaluation(topo, args, rs)
        others = main_rows(shared, rs, METHODS[1:])
        for trust in TRUSTS:
            rows += select_rows(shared, ("TORTA",), trust=trust) + [{**r, "trust": trust} for r in others]
        curves += [{"topology": topo, "seed": k, "episode": c["episode"], "mean_reward": c["mean_reward"]}
                   for k, seed_curve in enumerate(every_curve) for c in seed_curve]
    anchor = anchor_evaluation(TOPOLOGIES, args, rs)
    rows += [{**r, "trust": trust} for trust in TRUSTS for r in anchor]
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


def _by_seed(rows: list[dict], topo: str, trust: float, method: str, key: str = "mean_response_s") -> dict[int, float]:
    """``key`` of ``method``'s row per seed, in the rows of ``trust``."""
    return {int(float(r["seed"])): float(r[key]) for r in rows
            if r["topology"] == topo and float(r["trust"]) == trust and r["method"] == method}


def _paired(rows: list[dict], topo: str, trust: float, method: str,
            mine_method: str = "TORTA") -> tuple[float, float, float]:
    """``mine_method`` (TORTA) at ``trust`` against ``method`` (at the same trust's run) on mean response: the mean
    per-seed difference in seconds with its 95 % half-width, and ``mine_method``'s mean."""
    mine, other = _by_seed(rows, topo, trust, mine_method), _by_seed(rows, topo, trust, method)
    seeds = sorted(set(mine) & set(other))
    diff, half = mean_ci([mine[s] - other[s] for s in seeds])
    return diff, half, float(np.mean([mine[s] for s in seeds])) if seeds else math.nan


def _report(args: Any, rows: list[dict], curves: list[dict], rs: RunSettings) -> Summary:
    lines = [f"{rs.seeds} seeds × {len(TOPOLOGIES)} topologies, {rs.episodes} PPO episodes, {rs.slots} slots; "
             "paired by seed, TORTA − other in mean response (s), 95 % CI; one training per seed serves every trust "
             "(it bounds decisions only); plateau = episode where the smoothed reward reaches 95 % of its rise"]
    beats = 0
    for topo in TOPOLOGIES:
        parts = []
        for trust in TRUSTS:
            d_ot, h_ot, mean = _paired(rows, topo, trust, "OT-only")
            d_rl, h_rl, _ = _paired(rows, topo, trust, "RL-no-OT")
            if not math.isnan(h_ot) and d_ot + h_ot < 0:
                beats += 1
            parts.append(f"trust {trust:g}: TORTA {mean:.2f} s, vs OT-only {d_ot:+.2f} ± {h_ot:.2f}, vs RL-no-OT "
                         f"{d_rl:+.2f} ± {h_rl:.2f}")
        lines.append(f"{PAPER_NAME[topo]}: " + "; ".join(parts) + "; " + _plateau_text(_seed_curves(curves, topo)))
    lines.append(f"TORTA faster than OT alone (paired CI below zero) in {beats} of {len(TOPOLOGIES) * len(TRUSTS)} "
                 "(topology, trust) cells")
    lines += [_anchor_line(rows, topo, rs.params.policy_trust) for topo in TOPOLOGIES]
    save_figure(_figure(rows, curves), args.out / f"{NAME}.png")
    command = f"python -m petals_chain.experiments torta-trust{' --quick' if args.quick else ''} --seed {args.seed}"
    return Summary(NAME, "TORTA: the PPO layer's trust region against OT alone", command, lines, [])


def _anchor_line(rows: list[dict], topo: str, trust: float) -> str:
    """The anchor alone (the smoothed OT plan, no learning) against TORTA at the default ``trust`` and OT-only,
    paired by seed, with each one's switching; and whether the anchor run's OT-only equals the shared evaluation's
    seed by seed (same predictor and arrivals: the pairing holds)."""
    d_t, h_t, _ = _paired(rows, topo, trust, "anchor")
    d_o, h_o, mean = _paired(rows, topo, trust, "OT-only", mine_method="anchor")
    switching = {m: np.mean(list(_by_seed(rows, topo, trust, m, "switching").values()))
                 for m in ("TORTA", "anchor", "OT-only")}
    ot, again = _by_seed(rows, topo, trust, "OT-only"), _by_seed(rows, topo, trust, "OT-only (anchor run)")
    same = sum(ot[k] == again.get(k) for k in ot)
    return (f"{PAPER_NAME[topo]}, the anchor alone (smoothed OT plan, untrained): {mean:.2f} s; TORTA − anchor "
            f"{d_t:+.2f} ± {h_t:.2f}, anchor − OT-only {d_o:+.2f} ± {h_o:.2f}; switching TORTA "
            f"{switching['TORTA']:.3f}, anchor {switching['anchor']:.3f}, OT-only {switching['OT-only']:.3f}; the "
            f"anchor run's OT-only equals the shared evaluation's on {same} of {len(ot)} seeds")


def _seed_curves(curves: list[dict], topo: str) -> list[list[float]]:
    """The mean reward per episode of each seed's training on ``topo``, in seed order (a CSV without a seed column
    holds one seed's)."""
    by_seed: dict[int, list[float]] = {}
    for c in curves:
        if c["topology"] == topo:
            by_seed.setdefault(int(float(c.get("seed") or 0)), []).append(float(c["mean_reward"]))
    return [by_seed[k] for k in sorted(by_seed)]


def _plateau_text(seed_curves: list[list[float]]) -> str:
    """Where the learning curves stop rising: every seed's plateau episode, and how many are still rising (a
    plateau in the last fifth of the episodes: not converged)."""
    if not seed_curves:
        return "no learning curve"
    at = [plateau_episode(c) for c in seed_curves]
    rising = sum(a >= 0.8 * len(c) for a, c in zip(at, seed_curves))
    return (f"learning curve plateau at episode {int(np.median(at))} (median; seeds {', '.join(map(str, at))}) of "
            f"{len(seed_curves[0])}; {rising} of {len(at)} seeds still rising" + (" (not converged)" if rising else ""))


def _figure(rows: list[dict], curves: list[dict]):
    """Left: TORTA − OT-only per topology and trust, and the anchor alone − OT-only (paired mean, 95 % CI).
    Right: every seed's learning curve per topology and their mean."""
    from petals_chain.experiments.common import figure

    fig, axes = figure(1, 2, figsize=(12, 4.2))
    ax, bx = axes[0]
    width = 0.8 / (len(TRUSTS) + 1)
    for j, trust in enumerate(TRUSTS):
        st = [_paired(rows, t, trust, "OT-only") for t in TOPOLOGIES]
        ax.bar(np.arange(len(TOPOLOGIES)) + j * width, [s[0] for s in st], width,
               yerr=[0 if math.isnan(s[1]) else s[1] for s in st], capsize=2, label=f"TORTA, trust {trust:g}")
    st = [_paired(rows, t, TRUSTS[0], "OT-only", mine_method="anchor") for t in TOPOLOGIES]
    ax.bar(np.arange(len(TOPOLOGIES)) + len(TRUSTS) * width, [s[0] for s in st], width,
           yerr=[0 if math.isnan(s[1]) else s[1] for s in st], capsize=2, color="0.6", label="anchor alone")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(np.arange(len(TOPOLOGIES)) + 0.4 - width / 2, [PAPER_NAME[t] for t in TOPOLOGIES])
    ax.set_ylabel("minus OT-only, mean response (s)")
    ax.grid(axis="x", visible=False)
    for j, topo in enumerate(TOPOLOGIES):
        seed_curves = _seed_curves(curves, topo)
        for c in seed_curves:
            bx.plot(range(len(c)), c, color=f"C{j}", lw=0.6, alpha=0.35)
        if seed_curves:
            n = min(len(c) for c in seed_curves)
            bx.plot(range(n), np.mean([c[:n] for c in seed_curves], axis=0), color=f"C{j}", lw=2,
                    label=f"{PAPER_NAME[topo]} (mean of {len(seed_curves)} seeds)")
    bx.legend(fontsize=8)
    bx.set_xlabel("episode")
    bx.set_ylabel("mean reward per slot (thin: each seed)")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=len(TRUSTS) + 1, frameon=False)
    fig.suptitle("TORTA's PPO layer (at three trusts) and its anchor alone, against OT alone")
    return fig
