"""Train TORTA's PPO macro policy on one topology and write its learning curve and checkpoints.

``python -m petals_chain.experiments.torta_train --topology abilene [--episodes N] [--quick] [--seed S] [--out DIR]``
writes DIR/torta-train-TOPOLOGY.csv/.png (learning curve) and DIR/checkpoints/TOPOLOGY-epN.pt; ``--topology
live3`` trains for the live demo's regions (``petals_chain.torta.live_demo``). The training itself is
:func:`petals_chain.torta.train.train`; this module is its command line and its plot.
docs/torta.md, "Macro layer: PPO".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from petals_chain.experiments.common import REPO, plt, write_csv
from petals_chain.torta import live_demo
from petals_chain.torta.episode import make_scenario, oracle_forecast
from petals_chain.torta.params import DEFAULT, FULL_EPISODES, QUICK_EPISODES, QUICK_SCALE, QUICK_TRAINING, scaled
from petals_chain.torta.topology import TOPOHUB_KEYS
from petals_chain.torta.train import train


def plot_curve(curve: list[dict[str, float]], path: Path, title: str) -> None:
    """Learning curve PNG: mean reward, OT distance and switching per episode."""
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 3, figsize=(13, 3.6))
    ep = [r["episode"] for r in curve]
    for ax, key, label in zip(axes, ("mean_reward", "ot_distance", "switching"),
                              ("mean reward per slot", "‖A − Prob‖_F (sampled)", "‖A_t − A_{t−1}‖²_F")):
        ax.plot(ep, [r[key] for r in curve])
        ax.set_xlabel("episode")
        ax.set_ylabel(label)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)


def main(argv: list[str] | None = None) -> int:
    """CLI: train on one topology's scenario and write the curve and checkpoints."""
    ap = argparse.ArgumentParser(prog="python -m petals_chain.experiments.torta_train", description=__doc__)
    ap.add_argument("--topology", default="abilene", choices=sorted(TOPOHUB_KEYS) + [live_demo.TOPOLOGY],
                    help=f"a topohub network, or {live_demo.TOPOLOGY}: the live demo's three regions (torta-live)")
    ap.add_argument("--episodes", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-ot", action="store_true", help="the RL-without-OT ablation")
    ap.add_argument("--out", type=Path, default=REPO / "results")
    args = ap.parse_args(argv)
    episodes = args.episodes if args.episodes is not None else (QUICK_EPISODES if args.quick else FULL_EPISODES)
    if episodes < 1:
        print("error: --episodes must be >= 1", file=sys.stderr)
        return 2
    params = scaled(QUICK_TRAINING, QUICK_SCALE) if args.quick else DEFAULT  # --quick: the full day, scaled
    if args.topology == live_demo.TOPOLOGY:  # the live arrivals (other seeds) with the live moving-average forecast
        scenarios, forecast = live_demo.training_scenarios(args.seed), live_demo.live_forecast
    else:
        scenarios, forecast = [make_scenario(args.topology, params, args.seed)], oracle_forecast
    res = train(scenarios, forecast, episodes, args.seed, use_ot=not args.no_ot,
                checkpoint_dir=args.out / "checkpoints")
    name = f"torta-train-{args.topology}"
    write_csv(args.out / f"{name}.csv", res.curve)
    plot_curve(res.curve, args.out / f"{name}.png", f"PPO on {args.topology} (seed {args.seed})")
    print(f"{name}: reward {res.curve[0]['mean_reward']:.3f} -> {res.curve[-1]['mean_reward']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
