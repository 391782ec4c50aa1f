"""JFFC with migration on a live loopback swarm: mean response time against plain JFFC on the same arrivals, and
against the Theorem 3.7 lower bound for the chains as measured (docs/migration.md, "JFFC with migration").

Two servers hold the whole model (SmolLM2-135M when prepared); one runs at a tenth of the speed, so the orchestrator
composes a fast and a slow chain. One Poisson replay runs twice on the same swarm, first under plain JFFC, then
with ``POST /migrations {"policy": "jffc"}``: a session on the slow chain moves (by the faster mode: KV transfer
for SmolLM2) when a fast slot frees up and nobody waits. Every output must be the same in both runs (greedy
decoding; the move is invisible).
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.experiments.common import Summary, mean_ci, plt, write_csv
from petals_chain.experiments.migration_live import SpeedSwarm, model_dir, poisson_arrivals, prompts_for, replay
from petals_chain.loopback.swarm import ServerPlan

NAME = "migration-jffc"
SLOW_SPEED = 0.1
LOAD = 0.5
BUDGET = "437MB"  # SmolLM2-135M: 425 MB of fp32 blocks + 2 caches of 128 tokens (5.9 MB each)


def run(args: Any) -> Summary:
    """Start the swarm, replay under both policies, write CSV + PNG, return the summary."""
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
    _plot(out / f"{NAME}.png", runs, bound.lower_s)
    moves = sum(r.moves for r in moved)
    downtime = [r.move_downtime_s / r.moves for r in moved if r.moves]
    gain = 1.0 - means["jffc"][0] / means["none"][0]
    capacity = sum(c["capacity"] / t for c, t in zip(chains, measured))
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


def _plot(path: Path, runs: dict[str, list], lower_s: float) -> None:
    """Response-time CDFs of both policies with the lower bound's mean marked."""
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6.4, 4.0))
    for policy, label in (("none", "plain JFFC"), ("jffc", "JFFC with migration")):
        resp = np.sort([r.response_s for r in runs[policy] if not r.error])
        if resp.size:
            ax.step(resp, np.arange(1, resp.size + 1) / resp.size, where="post",
                    label=f"{label} (mean {resp.mean():.2f} s)")
    ax.axvline(lower_s, color="k", ls="--", label=f"Theorem 3.7 lower bound on the mean ({lower_s:.2f} s)")
    ax.set_xlabel("response time (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Live replay: JFFC with and without migration")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)
