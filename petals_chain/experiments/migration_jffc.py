"""JFFC with migration on a live loopback swarm: mean response time against plain JFFC on the same arrivals, and
against the Theorem 3.7 lower bound for the chains as measured (docs/migration.md, "JFFC with migration").

Two servers hold the whole model (SmolLM2-135M when prepared); one runs at a tenth of the speed, so the orchestrator
composes a fast and a slow chain. One Poisson replay runs twice on the same swarm, first under plain JFFC, then
with ``POST /migrations {"policy": "jffc"}``: a session on the slow chain moves (by the faster mode: KV transfer
for SmolLM2) when a fast slot frees up and nobody waits. Every output must be the same in both runs (greedy
decoding; the move is invisible).
"""

from __future__ import annotations

import json
import math
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.experiments.common import (Summary, figure, mean_ci, read_csv, replotting, save_figure,
                                             write_csv)
from petals_chain.experiments.migration_live import SpeedSwarm, model_dir, poisson_arrivals, prompts_for, replay
from petals_chain.loopback.swarm import ServerPlan

NAME = "migration-jffc"
SLOW_SPEED = 0.1
LOAD = 0.5
BUDGET = "437MB"  # SmolLM2-135M: 425 MB of fp32 blocks + 2 caches of 128 tokens (5.9 MB each)
REPLOT = True  # `--replot` redraws migration-jffc.png from the saved CSV and JSON (no swarm)
POLICIES = (("none", "plain JFFC"), ("jffc", "JFFC with migration"))


def run(args: Any) -> Summary:
    """Start the swarm, replay under both policies, write CSV + PNG, return the summary."""
    if replotting(args):
        return replot(args.out)
    quick = bool(args.quick)
    n, new_tokens = (16, 12) if quick else (40, 24)
    rng = np.random.default_rng(args.seed)
    out: Path = args.out
    with tempfile.TemporaryDirectory(prefix="migration-jffc-") as tmp:
        mdir, mname = model_dir(quick, Path(tmp))
        plans = [ServerPlan("fast", BUDGET), ServerPlan("slow", BUDGET)]
        sw = SpeedSwarm(mdir, plans, log_dir=Path(tmp) / "logs", model_name="smollm2", max_length=128,
                        arrival_rate=1.0, c=2, lease_ttl_s=30.0, heartbeat_timeout_s=60.0,
                        job_output_tokens=new_tokens, job_input_tokens=8, speeds={"slow": SLOW_SPEED})
        with sw:
            print(f"[{NAME}] starting the swarm ({mname}; slow server at speed {SLOW_SPEED})", flush=True)
            sw.start(timeout_s=600)
            chains = sw.get("/chains")["chains"]
            capacity_per_s = sum(c["capacity"] / c["service_time_s"] for c in chains)
            rate = LOAD * capacity_per_s
            arrivals = poisson_arrivals(n, rate, rng)
            from petals_chain import AutoDistributedModelForCausalLM

            model = AutoDistributedModelForCausalLM.from_pretrained(str(mdir), orchestrator=sw.url,
                                                                   lease_timeout_s=600.0, lease_ttl_s=30.0)
            prompts = prompts_for(n, int(model.config.vocab_size), rng)
            runs: dict[str, list] = {}
            try:
                for policy in ("none", "jffc"):
                    sw.set_policy(policy)
                    print(f"[{NAME}] replay of {n} requests at {rate:.3f}/s under policy {policy!r}", flush=True)
                    t0 = time.monotonic()
                    runs[policy] = replay(model, policy, arrivals, prompts, [new_tokens] * n, 128, 600.0)
                    print(f"[{NAME}]   done in {time.monotonic() - t0:.1f} s", flush=True)
                stats = sw.get("/migrations")
            finally:
                model.orchestrator.close()
    return _summarize(runs, chains, arrivals, rate, stats, mname, n, new_tokens, out, args)


def _summarize(runs: dict[str, list], chains: list[dict], arrivals: np.ndarray, rate: float, stats: dict,
               mname: str, n: int, new_tokens: int, out: Path, args: Any) -> Summary:
    """Means with 95 % intervals, the bound for the measured chains, the identity check; CSV + PNG."""
    plain, moved = runs["none"], runs["jffc"]
    errors = [r.error for r in plain + moved if r.error]
    identical = all(a.tokens == b.tokens for a, b in zip(plain, moved)) and not errors
    measured = []
    for c in chains:  # μ_k from plain JFFC's service times on chain k (the orchestrator's T_k if none ran there)
        svc = [r.service_s for r in plain if r.last_chain == c["chain_id"] and not r.error]
        measured.append(float(np.mean(svc)) if svc else float(c["service_time_s"]))
    lam = (n - 1) / float(arrivals[-1]) if arrivals[-1] > 0 else rate
    bound = theorem37_bounds([1.0 / t for t in measured], [c["capacity"] for c in chains], lam)
    means = {p: mean_ci([r.response_s for r in rs if not r.error]) for p, rs in runs.items()}
    write_csv(out / f"{NAME}.csv", [r.row() for r in plain + moved])
    moves = sum(r.moves for r in moved)
    downtime = [r.move_downtime_s / r.moves for r in moved if r.moves]
    gain = 1.0 - means["jffc"][0] / means["none"][0]
    capacity = sum(c["capacity"] / t for c, t in zip(chains, measured))
    _plot(out / f"{NAME}.png", {p: [r.response_s for r in rs if not r.error] for p, rs in runs.items()},
          bound.lower_s, bound.upper_s, lam / capacity, n)
    bound_text = (f"Theorem 3.7 lower bound for the measured chains {bound.lower_s:.2f} s (upper "
                  f"{bound.upper_s:.2f} s), a steady-state bound at the measured load λ/Σ c_k/T_k = "
                  f"{lam / capacity:.2f}, while the replay is {n} requests from an empty swarm"
                  if math.isfinite(bound.lower_s) else
                  f"no Theorem 3.7 bound: λ = {lam:.3f}/s is not below the measured chains' capacity "
                  f"Σ c_k/T_k = {capacity:.3f}/s (sessions sharing a server's CPU run slower than alone)")
    chain_text = ", ".join(f"{c['chain_id']} c={c['capacity']} measured T={t:.2f} s"
                           for c, t in zip(chains, measured))
    lines = [
        f"{mname}, two whole-model servers (one at speed {SLOW_SPEED}); chains: {chain_text}",
        f"{n} Poisson arrivals at λ = {lam:.3f}/s (load {LOAD} of the chains' capacity), {new_tokens} new tokens each, "
        "the same arrivals and prompts under both policies",
        f"mean response (95 % t-interval): plain JFFC {means['none'][0]:.2f} ± {means['none'][1]:.2f} s, JFFC with "
        f"migration {means['jffc'][0]:.2f} ± {means['jffc'][1]:.2f} s ({100 * abs(gain):.1f} % "
        f"{'less' if gain >= 0 else 'more'}); {bound_text}",
        f"moves: {moves} (orchestrator: {stats['completed']} completed, {stats['failed']} failed, "
        f"{stats['dropped']} dropped), mean downtime per move {np.mean(downtime) if downtime else float('nan'):.3f} s",
        f"outputs identical under both policies: {identical}; errors: {len(errors)}",
    ]
    return Summary(NAME, "JFFC with live migration vs plain JFFC vs the Theorem 3.7 lower bound",
                   f"python -m petals_chain.experiments {NAME}{' --quick' if args.quick else ''} --seed {args.seed}",
                   lines, data={"mean_response_s": {p: m[0] for p, m in means.items()}, "lower_bound_s": bound.lower_s,
                                "upper_bound_s": bound.upper_s, "moves": moves, "identical": identical,
                                "errors": errors[:5]})


def saved_plot_data(out: Path) -> tuple[dict[str, list[float]], float, float, float, int, dict]:
    """From the saved migration-jffc.csv and .json: the response times per policy, the bounds, the measured load,
    the requests per policy and the JSON document itself."""
    saved = json.loads((out / f"{NAME}.json").read_text())
    rows = read_csv(out / f"{NAME}.csv")
    responses = {p: [r["response_s"] for r in rows if r["policy"] == p and not r["error"]] for p, _ in POLICIES}
    load = re.search(r"= (\d+\.\d+), while", " ".join(saved["lines"]))
    n = sum(r["policy"] == "none" for r in rows)
    return (responses, saved["data"]["lower_bound_s"], saved["data"]["upper_bound_s"],
            float(load.group(1)) if load else math.nan, n, saved)


def replot(out: Path) -> Summary:
    """migration-jffc.png again from the saved migration-jffc.csv (one row per request and policy) and
    migration-jffc.json (its bound and summary lines, which are kept as they were)."""
    responses, lower, upper, load, n, saved = saved_plot_data(out)
    _plot(out / f"{NAME}.png", responses, lower, upper, load, n)
    return Summary(NAME, "JFFC with live migration vs plain JFFC vs the Theorem 3.7 lower bound", saved["command"],
                   saved["lines"], data=saved["data"])


def migration_figure(responses: dict[str, list[float]], lower_s: float, upper_s: float, load: float, n: int):
    """Response-time CDFs of both policies (every request a step, its mean ± 95 % CI as a bar below); the
    Theorem 3.7 bounds are a steady-state statement at the measured load and are written in the caption, not
    drawn next to a replay of ``n`` requests from an empty swarm, which they do not describe."""
    fig, axes = figure(figsize=(6.8, 4.4))
    ax = axes[0][0]
    for k, (policy, label) in enumerate(POLICIES):
        resp = np.sort(np.asarray(responses.get(policy, []), dtype=float))
        if not resp.size:
            continue
        mean, half = mean_ci(resp)
        line, = ax.step(resp, np.arange(1, resp.size + 1) / resp.size, where="post", marker=".",
                        label=f"{label}: mean {mean:.1f} ± {half:.1f} s (n = {resp.size})")
        ax.errorbar(mean, -0.06 - 0.06 * k, xerr=half, fmt="o", color=line.get_color(), capsize=3)
    ax.set_ylim(-0.18, 1.04)
    ax.set_xlabel("response time (s)")
    ax.set_ylabel("fraction of requests\n(below 0: mean ± 95 % CI)")
    ax.set_title("Live replay: JFFC with and without migration")
    ax.legend(loc="upper left", fontsize=8)
    bound = (f"Theorem 3.7 bounds for the measured chains: [{lower_s:.0f}, {upper_s:.0f}] s, a steady-state mean at "
             f"load {load:.2f}; not drawn: this replay is {n} requests from an empty swarm, far from steady state"
             if math.isfinite(lower_s) else "no Theorem 3.7 bound: the measured load is not below the chains' capacity")
    fig.supxlabel(bound, fontsize=7, wrap=True)
    return fig


def _plot(path: Path, responses: dict[str, list[float]], lower_s: float, upper_s: float, load: float,
          n: int) -> None:
    """Draw :func:`migration_figure` to ``path``."""
    save_figure(migration_figure(responses, lower_s, upper_s, load, n), path)
