"""Mell Fig. 6 (Finding 3): requests a fixed pool of GPUs holds with and without migration."""

from __future__ import annotations

from tqdm import tqdm

from petals_chain.experiments.common import Summary, mean_ci, plt, write_csv
from petals_chain.experiments.mell_common import RATES, SETTINGS, command, config, scale, workload
from petals_chain.experiments.paper import run_seeds
from petals_chain.mell.serving import serve_fixed

POOL = 8  # GPUs in the fixed pool


def run(args) -> Summary:
    """Serve the same arrivals on POOL GPUs with and without migration for each setting and rate."""
    sc = scale(args.quick)
    horizon_s = 400.0 if args.quick else 1200.0
    rows = []
    cells = [(s, w) for s in SETTINGS for w in RATES]
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
    lines, gains = [], []
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(8, 4))
    labels = []
    for k, (s, w) in enumerate(cells):
        v = {m: mean_ci([x["mean_running"] for x in rows if x["setting"] == s and x["workload"] == w
                         and x["migration"] == m]) for m in (False, True)}
        done = {m: mean_ci([x["completed"] for x in rows if x["setting"] == s and x["workload"] == w
                            and x["migration"] == m])[0] for m in (False, True)}
        gain = 100 * (v[True][0] / v[False][0] - 1)
        gains.append(gain)
        ax.bar(k - 0.2, v[False][0], 0.4, color="tab:grey", label="without migration" if k == 0 else None)
        ax.bar(k + 0.2, v[True][0], 0.4, color="tab:blue", label="with migration" if k == 0 else None)
        ax.text(k + 0.2, v[True][0], f"+{gain:.0f} %", ha="center", va="bottom", fontsize=8)
        labels.append(f"{s}\n{w}")
        lines.append(f"{s} {w}: {v[False][0]:.1f} → {v[True][0]:.1f} requests held ({gain:+.1f} %); "
                     f"completed {done[False]:.0f} → {done[True]:.0f}")
    ax.set_xticks(range(len(cells)), labels, fontsize=7)
    ax.set_ylabel(f"requests held in KV cache (mean, {POOL} GPUs)")
    ax.set_title("Mell Fig. 6: a fixed GPU pool with and without migration")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out / "mell_fig6.png")
    pyplot.close(fig)
    lines.append(f"gain range {min(gains):.1f} to {max(gains):.1f} %")
    return Summary("mell_fig6", "Mell: requests served with vs without migration", command("mell-fig6", args),
                   lines, ["migration lets the system hold 23–60 % more requests"], {"gains": gains})
