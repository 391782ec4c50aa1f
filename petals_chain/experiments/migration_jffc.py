"""JFFC with migration on a live loopback swarm: mean response time in steady state against plain JFFC on the same
arrivals, paired by replication, and against the Theorem 3.7 bounds for the chains and load as measured
(docs/migration.md, "JFFC with migration").

Two servers hold the whole model (SmolLM2-135M when prepared); one runs at a tenth of the speed, so the orchestrator
composes a fast and a slow chain. At the swarm's start a calibration fills every slot at once and times each
chain's service, which sets the arrival rate (``LOAD`` of the chains' capacity Σ c_k/T_k as they run full, not as the
orchestrator estimated them). Each replication draws its own Poisson arrivals and prompts and replays them twice,
under plain JFFC and with ``POST /migrations {"policy": "jffc"}`` (a session on the slow chain moves, by KV transfer
for SmolLM2, when a fast slot frees up and nobody waits), the order alternating from one replication to the next.
Only the requests arriving in the middle of a replay are measured: the first ``WARMUP`` arrive while the swarm fills
from empty, the last ``TAIL`` while arrivals stop and the swarm drains (with nobody arriving, more sessions move
than in steady state). The comparison is the paired difference of the measured requests' mean response; the bounds
are Theorem 3.7's for the service times each replication measured under plain JFFC and its arrival rate. Every
output must be the same under both policies (greedy decoding: the move is invisible). A full run keeps each
replication in its checkpoint (results/resume/) with the machine's load average, and resumes from it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.experiments.common import (Summary, checkpoint_path, figure, mean_ci, read_csv, replotting,
                                             save_figure, write_csv)
from petals_chain.experiments.migration_live import (Request, SpeedSwarm, load_replications, poisson_arrivals,
                                                     prompts_for, replay, replay_swarm, save_replication, wait_idle)
from petals_chain.experiments.paired import paired
from petals_chain.loopback.swarm import ServerPlan

NAME = "migration-jffc"
SLOW_SPEED = 0.1
# Of the chains' capacity measured full at the calibration. A replay at this rate seldom fills the fast chain, whose
# sessions then run faster than when full: the load as the replay measures it comes out near 0.5 (0.29 at 0.5 here).
LOAD = 0.8
BUDGET = "437MB"  # SmolLM2-135M: 425 MB of fp32 blocks + 2 caches of 128 tokens (5.9 MB each)
REPLOT = True  # `--replot` redraws migration-jffc.png from the saved CSV and JSON (no swarm)
TITLE = "JFFC with live migration vs plain JFFC, in steady state, vs the Theorem 3.7 bounds"
POLICIES = (("none", "plain JFFC"), ("jffc", "JFFC with migration"))
FULL = {"warmup": 6, "measured": 24, "tail": 6, "new_tokens": 16, "replications": 8}
QUICK = {"warmup": 2, "measured": 6, "tail": 2, "new_tokens": 12, "replications": 1}


def run(args: Any) -> Summary:
    """Start the swarm, calibrate, run every replication not yet in the checkpoint (both policies on one replay
    each), write CSV + PNG, return the summary."""
    if replotting(args):
        return replot(args.out)
    size = QUICK if args.quick else FULL
    ckpt = checkpoint_path(NAME, args, __name__)
    done = load_replications(ckpt, _key)
    missing = [i for i in range(size["replications"]) if i not in done]
    if missing:
        plans = [ServerPlan("fast", BUDGET), ServerPlan("slow", BUDGET)]
        speeds = {"slow": SLOW_SPEED}
        with replay_swarm(NAME, bool(args.quick), plans, size["new_tokens"], speeds) as (sw, model, mname):
            calibration = _calibrate(sw, model, size["new_tokens"], args.seed)
            for rep in missing:
                done[rep] = _replication(sw, model, rep, size, calibration, mname, args.seed)
                save_replication(ckpt, done[rep])
    return _summarize([done[i] for i in range(size["replications"])], size, args)


def _key(rep: dict[str, Any]) -> int:
    """A replication's index."""
    return int(rep["rep"])


def _calibrate(sw: SpeedSwarm, model: Any, new_tokens: int, seed: int) -> dict[str, Any]:
    """Every slot filled at once (Σ c_k requests arriving together under plain JFFC): each chain's mean service
    time when full, and the capacity Σ c_k / T_k the arrival rate is set from."""
    chains = sw.get("/chains")["chains"]
    slots = sum(int(c["capacity"]) for c in chains)
    rng = np.random.default_rng([seed, 10**6])
    sw.set_policy("none")
    print(f"[{NAME}] calibration: {slots} requests at once, {new_tokens} new tokens each", flush=True)
    reqs = replay(model, "none", np.zeros(slots), prompts_for(slots, int(model.config.vocab_size), rng),
                  [new_tokens] * slots, 128, 600.0)
    wait_idle(sw)
    errors = [r.error for r in reqs if r.error]
    if errors:
        raise RuntimeError(f"{NAME}: the calibration failed: {errors[0]}")
    service = {}
    for c in chains:
        svc = [r.service_s for r in reqs if r.last_chain == c["chain_id"]]
        service[c["chain_id"]] = float(np.mean(svc)) if svc else float(c["service_time_s"])
    capacity = sum(int(c["capacity"]) / service[c["chain_id"]] for c in chains)
    print(f"[{NAME}]   service when full: {service}; capacity {capacity:.3f}/s", flush=True)
    return {"chains": [{"chain_id": c["chain_id"], "capacity": int(c["capacity"]),
                        "orchestrator_service_time_s": float(c["service_time_s"]),
                        "full_service_time_s": service[c["chain_id"]]} for c in chains],
            "capacity_per_s": capacity}


def _replication(sw: SpeedSwarm, model: Any, rep: int, size: dict[str, int], calibration: dict[str, Any],
                 mname: str, seed: int) -> dict[str, Any]:
    """One replay (its own arrivals and prompts) under both policies, in the order the replication's parity gives;
    the requests, the orchestrator's move counts and the machine's load average before and after."""
    rng = np.random.default_rng([seed, rep])
    n = size["warmup"] + size["measured"] + size["tail"]
    rate = LOAD * calibration["capacity_per_s"]
    arrivals = poisson_arrivals(n, rate, rng)
    prompts = prompts_for(n, int(model.config.vocab_size), rng)
    order = [p for p, _ in POLICIES] if rep % 2 == 0 else [p for p, _ in reversed(POLICIES)]
    runs: dict[str, list[Request]] = {}
    stats: dict[str, dict[str, int]] = {}
    load_before = os.getloadavg()
    for policy in order:
        before = sw.set_policy(policy)
        print(f"[{NAME}] replication {rep}: {n} requests at {rate:.3f}/s under {policy!r}", flush=True)
        t0 = time.monotonic()
        runs[policy] = replay(model, policy, arrivals, prompts, [size["new_tokens"]] * n, 128, 600.0)
        after = sw.get("/migrations")
        stats[policy] = {k: after[k] - before[k] for k in ("offered", "completed", "failed", "dropped")}
        print(f"[{NAME}]   done in {time.monotonic() - t0:.1f} s", flush=True)
        wait_idle(sw)
    return {"rep": rep, "model": mname, "rate": rate, "calibration": calibration, "order": order, "runs": runs,
            "stats": stats, "loadavg": [load_before, os.getloadavg()], **{k: size[k] for k in
                                                                          ("warmup", "measured", "tail")}}


def measured(rep: dict[str, Any], policy: str) -> list[Request]:
    """The requests of ``policy``'s replay that count: neither in the warm-up nor in the tail."""
    return rep["runs"][policy][rep["warmup"]:rep["warmup"] + rep["measured"]]


def replication_figures(rep: dict[str, Any]) -> dict[str, Any]:
    """One replication's figures: each policy's mean response over the measured requests, the arrival rate the
    replay had (its arrivals over their span), the chains' mean service under plain JFFC (all its requests on
    that chain) and Theorem 3.7's bounds for them."""
    means = {p: float(np.mean([r.response_s for r in measured(rep, p)])) for p, _ in POLICIES}
    arrivals = np.array([r.arrival_s for r in rep["runs"]["none"]])
    lam = (arrivals.size - 1) / float(arrivals[-1] - arrivals[0])
    chains = rep["calibration"]["chains"]
    service = []
    for c in chains:
        svc = [r.service_s for r in rep["runs"]["none"] if r.last_chain == c["chain_id"] and not r.error]
        service.append(float(np.mean(svc)) if svc else c["full_service_time_s"])
    bound = theorem37_bounds([1.0 / t for t in service], [c["capacity"] for c in chains], lam)
    capacity = sum(c["capacity"] / t for c, t in zip(chains, service))
    return {"rep": rep["rep"], "mean_response_s": means, "arrival_rate": lam, "service_s": service,
            "load": lam / capacity, "lower_s": bound.lower_s, "upper_s": bound.upper_s,
            "loadavg": rep["loadavg"][0][0]}


def _summarize(reps: list[dict[str, Any]], size: dict[str, int], args: Any) -> Summary:
    """Paired difference of the steady-state means, the bounds beside plain JFFC's mean, moves and the identity
    check; CSV + PNG."""
    out: Path = args.out
    rows, errors, identical = [], [], True
    for rep in reps:
        plain, moved = rep["runs"]["none"], rep["runs"]["jffc"]
        errors += [r.error for r in plain + moved if r.error]
        identical &= all(a.tokens == b.tokens for a, b in zip(plain, moved))
        window = range(rep["warmup"], rep["warmup"] + rep["measured"])
        rows += [{"rep": rep["rep"], **r.row(), "measured": r.request in window} for r in plain + moved]
    identical &= not errors
    if errors:  # a failed request has no response time: the paired means would be of different sets
        raise RuntimeError(f"{NAME}: {len(errors)} requests failed, e.g. {errors[0]}")
    write_csv(out / f"{NAME}.csv", rows)
    figs = [replication_figures(rep) for rep in reps]
    diff = paired([f["mean_response_s"]["jffc"] - f["mean_response_s"]["none"] for f in figs])
    pct = paired([100 * (1 - f["mean_response_s"]["jffc"] / f["mean_response_s"]["none"]) for f in figs])
    plain = mean_ci([f["mean_response_s"]["none"] for f in figs])
    lower, upper = (float(np.mean([f[k] for f in figs])) for k in ("lower_s", "upper_s"))
    _plot(out / f"{NAME}.png", figs, rows)
    cal = reps[0]["calibration"]
    moved = [r for rep in reps for r in measured(rep, "jffc")]
    downtime = [r.move_downtime_s / r.moves for r in moved if r.moves]
    stats = {p: {k: sum(rep["stats"][p][k] for rep in reps) for k in ("completed", "failed", "dropped")}
             for p, _ in POLICIES}
    chain_text = ", ".join(f"{c['chain_id']} c={c['capacity']} (T when full {c['full_service_time_s']:.2f} s, "
                           f"orchestrator's estimate {c['orchestrator_service_time_s']:.2f} s)" for c in cal["chains"])
    service = np.mean([f["service_s"] for f in figs], axis=0)
    loadavg = [f["loadavg"] for f in figs]
    inside = lower <= plain[0] <= upper
    lines = [
        f"{reps[0]['model']}, two whole-model servers (one at speed {SLOW_SPEED}); chains: {chain_text}",
        f"{len(reps)} replication{'s' if len(reps) > 1 else ''}, each {size['warmup']} + {size['measured']} + "
        f"{size['tail']} Poisson arrivals at {LOAD} of the capacity measured full ({_rates(figs)} arrivals/s), "
        f"{size['new_tokens']} new tokens each, the same arrivals and prompts under both policies in alternating "
        f"order; only the middle {size['measured']} count (the first {size['warmup']} fill the swarm, the last "
        f"{size['tail']} see it drain)",
        f"steady-state mean response per replication: plain JFFC {plain[0]:.2f} s, JFFC with migration "
        f"{np.mean([f['mean_response_s']['jffc'] for f in figs]):.2f} s; migration minus plain, paired: "
        f"{diff.text(' s', 2)}; the same as a saving: {pct.text(' %')}",
        f"Theorem 3.7 for the chains as they ran under plain JFFC (mean service "
        f"{', '.join(f'{t:.2f} s' for t in service)}) at the replays' rate (load {_range(figs, 'load')}): "
        f"[{lower:.2f}, {upper:.2f}] s on average over the replications; plain JFFC's steady-state mean "
        f"{plain[0]:.2f} ± {plain[1]:.2f} s is {'inside' if inside else 'outside'} it",
        _slow_line(reps),
        f"moves: {stats['jffc']['completed']} completed, {stats['jffc']['failed']} failed, {stats['jffc']['dropped']} "
        f"dropped; mean downtime per move of a measured request "
        f"{np.mean(downtime) if downtime else float('nan'):.3f} s",
        f"outputs identical under both policies: {identical}; errors: {len(errors)}; machine load average (1 min) at "
        f"the replications' starts {min(loadavg):.2f}–{max(loadavg):.2f} (the swarm's own processes on 2 cores)",
    ]
    data = {"replications": figs, "difference_s": dataclasses.asdict(diff), "saving_percent": dataclasses.asdict(pct),
            "plain_mean_s": plain[0], "lower_bound_s": lower, "upper_bound_s": upper, "moves": stats,
            "identical": identical, "calibration": cal}
    return Summary(NAME, TITLE,
                   f"python -m petals_chain.experiments {NAME}{' --quick' if args.quick else ''} --seed {args.seed}",
                   lines, data=data)


def _slow_line(reps: list[dict[str, Any]]) -> str:
    """Where the measured requests ran: how many started on the slowest chain under each policy and their mean
    response, and each policy's median response (a move frees a slow slot but fills a fast one, so the next
    arrival may start on the slow chain)."""
    slowest = max(reps[0]["calibration"]["chains"], key=lambda c: c["full_service_time_s"])["chain_id"]
    parts = []
    for policy, label in POLICIES:
        reqs = [r for rep in reps for r in measured(rep, policy)]
        slow = [r for r in reqs if r.first_chain == slowest]
        mean = f"mean response {np.mean([r.response_s for r in slow]):.2f} s" if slow else "none"
        parts.append(f"{label} {len(slow)} of {len(reqs)} ({sum(r.moves > 0 for r in slow)} moved; {mean}), "
                     f"median response {np.median([r.response_s for r in reqs]):.2f} s")
    return f"measured requests that started on the slow chain {slowest}: " + "; ".join(parts)


def _range(figs: list[dict[str, Any]], key: str) -> str:
    """One figure, or the replications' range."""
    lo, hi = min(f[key] for f in figs), max(f[key] for f in figs)
    return f"{lo:.2f}" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}–{hi:.2f}"


def _rates(figs: list[dict[str, Any]]) -> str:
    return _range(figs, "arrival_rate")


def saved_plot_data(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """From the saved migration-jffc.json and .csv: the replications' figures and the requests' rows."""
    saved = json.loads((out / f"{NAME}.json").read_text())
    return saved["data"]["replications"], read_csv(out / f"{NAME}.csv")


def replot(out: Path) -> Summary:
    """migration-jffc.png again from the saved migration-jffc.json (its replications' figures and summary lines,
    kept as they were) and .csv (one row per request and policy)."""
    saved = json.loads((out / f"{NAME}.json").read_text())
    _plot(out / f"{NAME}.png", *saved_plot_data(out))
    return Summary(NAME, TITLE, saved["command"], saved["lines"], data=saved["data"])


def migration_figure(figs: list[dict[str, Any]], rows: list[dict[str, Any]]):
    """Left: each replication's steady-state mean response under both policies, joined by a line, with Theorem
    3.7's interval for that replication as a grey bar behind plain JFFC. Right: the measured requests' response
    times pooled over the replications, one CDF per policy."""
    fig, axes = figure(1, 2, figsize=(10.0, 4.2), width_ratios=[2, 3])
    ax, bx = axes[0]
    for i, f in enumerate(figs):
        if math.isfinite(f["upper_s"]):
            ax.plot([0, 0], [f["lower_s"], f["upper_s"]], color="0.75", lw=8, solid_capstyle="butt",
                    label="Theorem 3.7 bounds" if i == 0 else None, zorder=1)
        ax.plot([0, 1], [f["mean_response_s"]["none"], f["mean_response_s"]["jffc"]], "o-", color="tab:blue",
                alpha=0.7, label="one replication" if i == 0 else None, zorder=2)
    ax.set_xticks([0, 1], [label for _, label in POLICIES])
    ax.set_xlim(-0.5, 1.5)
    ax.set_ylabel("mean response of the measured requests (s)")
    ax.set_title("Paired by replication")
    ax.legend(loc="upper right", fontsize=8)
    for policy, label in POLICIES:
        resp = np.sort([float(r["response_s"]) for r in rows if r["policy"] == policy and _true(r["measured"])])
        if resp.size:
            mean, half = mean_ci(resp)
            bx.step(resp, np.arange(1, resp.size + 1) / resp.size, where="post",
                    label=f"{label}: mean {mean:.1f} ± {half:.1f} s (n = {resp.size})")
    bx.set_xlabel("response time (s)")
    bx.set_ylabel("fraction of measured requests")
    bx.set_title("All replications' measured requests")
    bx.legend(loc="lower right", fontsize=8)
    return fig


def _true(value: Any) -> bool:
    """A CSV boolean back (read_csv may give a bool or its text)."""
    return value is True or str(value).lower() == "true"


def _plot(path: Path, figs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """Draw :func:`migration_figure` to ``path``."""
    save_figure(migration_figure(figs, rows), path)
