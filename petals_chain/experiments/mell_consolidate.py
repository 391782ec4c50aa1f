"""Consolidation with Mell on a live loopback swarm: server-seconds used against worst fit on the same arrivals,
every output identical (docs/migration.md, "Consolidation").

Three servers each hold the whole model (SmolLM2-135M when prepared), so every chain is one server with ``c`` slots.
At each load (a fraction of the swarm's measured capacity), each replication draws a Poisson replay with random
output lengths and runs it twice on the same swarm: the orchestrator packs sessions by worst fit (``POST
/migrations {"policy": "worst-fit"}``, never moving one), and by Mell's scheduler (``"mell"``: a server that loses
a session takes one from the most recently opened server, which can then be released), in alternating order from
one replication to the next. A server is counted as used while any session holds its cache (during a move, both
servers). The comparison is paired by replication (the same arrivals, prompts and lengths under both packers): the
mean saving with its 95 % interval, or, where the interval includes zero, the saving the run could have detected
(experiments/paired.py). A full run keeps each finished replication in its checkpoint (results/resume/) and
resumes from it; each records the machine's load average.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from petals_chain.experiments.common import Summary, checkpoint_path, plt, read_csv, save_figure, write_csv
from petals_chain.experiments.migration_live import (
    Request,
    SpeedSwarm,
    poisson_arrivals,
    prompts_for,
    load_replications,
    replay,
    replay_swarm,
    save_replication,
    server_seconds,
    wait_idle,
)
from petals_chain.experiments.paired import paired
from petals_chain.loopback.swarm import ServerPlan

NAME = "mell-consolidate"
BUDGET = "437MB"  # SmolLM2-135M: 425 MB of fp32 blocks + 2 caches of 128 tokens (5.9 MB each)
POLICIES = (("worst-fit", "worst fit"), ("mell", "Mell"))
# Loads as fractions of the swarm's capacity as the orchestrator measured it: at 0.8 the three servers are nearly
# always all needed, at 0.4 packing can empty one. Replication i draws the same uniforms at every load (its arrival
# times scale with the rate): common random numbers across loads.
LOADS = (0.8, 0.4)
REPLICATIONS = 8  # full run: paired replications per load (2-3 minutes each here)


def run(args: Any) -> Summary:
    """Start the swarm, run every replication not yet in the checkpoint (both packers on one replay each), write
    CSV + PNG, return the summary."""
    quick = bool(args.quick)
    n, lo, hi = (12, 8, 64) if quick else (30, 8, 96)
    reps = 1 if quick else REPLICATIONS
    loads = LOADS[:1] if quick else LOADS
    ckpt = checkpoint_path(NAME, args, __name__)
    done = load_replications(ckpt, _key)
    missing = [(load, i) for load in loads for i in range(reps) if (load, i) not in done]
    if missing:
        plans = [ServerPlan(f"g{i}", BUDGET) for i in range(3)]
        with replay_swarm(NAME, quick, plans, (lo + hi) // 2) as (sw, model, mname):
            for load, rep in missing:
                done[(load, rep)] = _replication(sw, model, load, rep, n, (lo, hi), mname, args.seed)
                save_replication(ckpt, done[(load, rep)])
    return _summarize({load: [done[(load, i)] for i in range(reps)] for load in loads}, n, (lo, hi), args)


def _replication(sw: SpeedSwarm, model: Any, load: float, rep: int, n: int, lengths: tuple[int, int], mname: str,
                 seed: int) -> dict[str, Any]:
    """One replay at ``load`` (its own arrivals, prompts and lengths) under both packers, in the order the
    replication's parity gives; the requests, the orchestrator's move counts, the measured chains and the machine's
    load average before and after."""
    rng = np.random.default_rng([seed, rep])
    chains = sw.get("/chains")["chains"]
    service_s = float(np.mean([c["service_time_s"] for c in chains]))
    rate = load * sum(c["capacity"] for c in chains) / service_s
    arrivals = poisson_arrivals(n, rate, rng)
    new_tokens = rng.integers(lengths[0], lengths[1] + 1, n).tolist()
    prompts = prompts_for(n, int(model.config.vocab_size), rng)
    order = [p for p, _ in POLICIES] if rep % 2 == 0 else [p for p, _ in reversed(POLICIES)]
    runs: dict[str, list[Request]] = {}
    stats: dict[str, dict] = {}
    load_before = os.getloadavg()
    for policy in order:
        before = sw.set_policy(policy)
        print(f"[{NAME}] load {load}, replication {rep}: {n} requests at {rate:.3f}/s packed by {policy}", flush=True)
        t0 = time.monotonic()
        runs[policy] = replay(model, policy, arrivals, prompts, new_tokens, 128, 600.0)
        after = sw.get("/migrations")
        stats[policy] = {k: after[k] - before[k] for k in ("offered", "completed", "failed", "dropped")}
        print(f"[{NAME}]   done in {time.monotonic() - t0:.1f} s", flush=True)
        wait_idle(sw)
    return {"load_fraction": load, "rep": rep, "model": mname, "rate": rate, "chains": [{"chain_id": c["chain_id"],
                                                                  "capacity": c["capacity"],
                                                                  "service_time_s": c["service_time_s"]}
                                                                 for c in chains],
            "order": order, "runs": runs, "stats": stats, "loadavg": [load_before, os.getloadavg()]}


def _key(rep: dict[str, Any]) -> tuple[float, int]:
    """A replication's place in the run: (load fraction, index)."""
    return float(rep["load_fraction"]), int(rep["rep"])


def _modes(reqs: list) -> str:
    """How the requests' completed moves went, e.g. 'kv 5, token 1' (the adaptive division's picks)."""
    counts = Counter(m for r in reqs for m in r.move_modes)
    return ", ".join(f"{mode} {n}" for mode, n in sorted(counts.items())) or "none"


def _summarize(by_load: dict[float, list[dict[str, Any]]], n: int, lengths: tuple[int, int], args: Any) -> Summary:
    """Per load: server-seconds per packer and replication, the paired saving, the paired response difference;
    moves and the identity check over all; CSV + PNG."""
    out: Path = args.out
    rows, errors, identical = [], [], True
    per_load: dict[float, list[dict[str, Any]]] = {}
    for load, reps in by_load.items():
        per_load[load] = []
        for rep in reps:
            wf, mell = rep["runs"]["worst-fit"], rep["runs"]["mell"]
            errors += [r.error for r in wf + mell if r.error]
            identical &= all(a.tokens == b.tokens for a, b in zip(wf, mell))
            used = {p: sum(server_seconds(rs).values()) for p, rs in rep["runs"].items()}
            resp = {p: float(np.mean([r.response_s for r in rs if not r.error])) for p, rs in rep["runs"].items()}
            per_load[load].append({"rep": rep["rep"], "used": used, "resp": resp, "rate": rep["rate"],
                                   "loadavg": rep["loadavg"], "moves": rep["stats"]["mell"]["completed"]})
            for p, rs in rep["runs"].items():
                for r in rs:
                    row = {"load": load, "rep": rep["rep"], **r.row()}
                    row["chains"] = " ".join(f"{c}:{a:.2f}-{b:.2f}" for c, a, b in r.segments)
                    rows.append(row)
    identical &= not errors
    write_csv(out / f"{NAME}.csv", rows)
    low = min(by_load)
    save_figure(consolidate_figure(by_load[low][0]["runs"], low, per_load), out / f"{NAME}.png")
    everything = [rep for reps in by_load.values() for rep in reps]
    chains = everything[0]["chains"]
    nreps = {len(reps) for reps in by_load.values()}
    lines = [
        f"{everything[0]['model']}, three whole-model servers, {len(chains)} chains of {chains[0]['capacity']} slots "
        f"each; at each load, {'/'.join(map(str, sorted(nreps)))} replication{'s' if max(nreps) > 1 else ''} of {n} "
        f"Poisson arrivals, {lengths[0]}-{lengths[1]} new tokens each (uniform); in each, the same arrivals, prompts "
        "and lengths under both packers, their order alternating",
    ]
    data: dict[str, Any] = {}
    for load, reps in per_load.items():
        saving = paired([100 * (1 - r["used"]["mell"] / r["used"]["worst-fit"]) for r in reps])
        seconds = paired([r["used"]["worst-fit"] - r["used"]["mell"] for r in reps])
        slower = paired([r["resp"]["mell"] - r["resp"]["worst-fit"] for r in reps])
        total = {p: float(np.mean([r["used"][p] for r in reps])) for p, _ in POLICIES}
        lines += [
            f"load {load} ({_rates(reps)} arrivals/s): server-seconds used per replication (a server counts "
            f"while any session holds its cache): worst fit {total['worst-fit']:.1f} s, Mell {total['mell']:.1f} s "
            f"on average; Mell's saving, paired by replication: {saving.text(' %')}",
            f"load {load}: Mell's mean response minus worst fit's, paired: {slower.text(' s', 2)}; moves "
            f"{sum(r['moves'] for r in reps)}",
        ]
        data[str(load)] = {"replications": reps, "saving_percent": dataclasses.asdict(saving),
                           "saving_s": dataclasses.asdict(seconds), "response_s": dataclasses.asdict(slower)}
    stats = {p: {k: sum(rep["stats"][p][k] for rep in everything) for k in ("completed", "failed", "dropped")}
             for p, _ in POLICIES}
    loadavg = [r["loadavg"][0][0] for reps in per_load.values() for r in reps]
    mell_reqs = [r for rep in everything for r in rep["runs"]["mell"]]
    lines += [
        f"moves: Mell {stats['mell']['completed']} completed ({_modes(mell_reqs)}; {stats['mell']['failed']} failed, "
        f"{stats['mell']['dropped']} dropped), worst fit {stats['worst-fit']['completed']}",
        f"outputs identical under both packers: {identical}; errors: {len(errors)}; machine load average (1 min) at "
        f"the replications' starts {min(loadavg):.2f}–{max(loadavg):.2f} (the swarm's own processes on 2 cores)",
    ]
    data.update({"moves": stats, "identical": identical, "errors": errors[:5]})
    return Summary(NAME, "Consolidation by Mell on a live swarm: server-seconds against worst fit",
                   f"python -m petals_chain.experiments {NAME}{' --quick' if args.quick else ''} --seed {args.seed}",
                   lines, paper=["Mell (simulated GPU clusters): up to 31 % fewer GPUs than worst fit"], data=data)


def _rates(reps: list[dict[str, Any]]) -> str:
    """The replications' arrival rates: one figure, or their range (the capacity is measured at each swarm start,
    so replications run in different sessions can differ; both packers of a replication see the same)."""
    lo, hi = min(r["rate"] for r in reps), max(r["rate"] for r in reps)
    return f"{lo:.3f}" if round(lo, 3) == round(hi, 3) else f"{lo:.3f}–{hi:.3f}"


def saved_plot_data(out: Path) -> tuple[dict[str, list], float, dict[float, list[dict[str, Any]]]]:
    """The figure's inputs from the committed files: each replication's server-seconds from ``NAME.json``, and the
    sessions' chain segments of the lowest load's first replication from ``NAME.csv``."""
    import json

    data = json.loads((out / f"{NAME}.json").read_text())["data"]
    per_load = {float(k): v["replications"] for k, v in data.items() if isinstance(v, dict) and "replications" in v}
    low = min(per_load)
    first = per_load[low][0]["rep"]
    runs: dict[str, list] = {p: [] for p, _ in POLICIES}
    for row in read_csv(out / f"{NAME}.csv"):
        if row["load"] == low and row["rep"] == first:
            segments = []
            for part in str(row["chains"] or "").split():
                chain, span = part.rsplit(":", 1)
                a, b = span.split("-")
                segments.append((chain, float(a), float(b)))
            runs[row["policy"]].append(SimpleNamespace(segments=segments))
    return runs, low, per_load


def consolidate_figure(runs: dict[str, list], load: float, per_load: dict[float, list[dict[str, Any]]]) -> Any:
    """Left: servers in use over time under each packer in the first replication at ``load`` (a step function from
    the sessions' busy segments). Right: each replication's server-seconds under both packers, joined by a line,
    one colour per load; the legends sit in headroom above the data."""
    pyplot = plt()
    fig, (ax, bx) = pyplot.subplots(1, 2, figsize=(10.0, 4.0), gridspec_kw={"width_ratios": [3, 2]})
    for policy, label in POLICIES:
        edges: list[tuple[float, int]] = []
        by_chain: dict[str, list[tuple[float, float]]] = {}
        for r in runs[policy]:
            for c, a, b in r.segments:
                by_chain.setdefault(c, []).append((a, b))
        for spans in by_chain.values():
            for a, b in _union(spans):
                edges += [(a, 1), (b, -1)]
        edges.sort()
        t = [0.0]
        y = [0]
        for when, d in edges:
            t.append(when)
            y.append(y[-1] + d)
        ax.step(t, y, where="post", label=f"{label} ({per_load[load][0]['used'][policy]:.1f} server-s)")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("servers holding a session")
    ax.set_title(f"Load {load}, replication {per_load[load][0]['rep']}: servers in use")
    top = max(ax.get_ylim()[1], 1.0)
    ax.set_ylim(-0.2, top * 1.45)  # headroom for the legend above the steps
    ax.set_yticks(range(int(top) + 1))
    ax.legend(loc="upper center", ncols=2)
    for (lf, reps), color in zip(sorted(per_load.items()), ("tab:green", "tab:purple", "0.4")):
        for i, r in enumerate(reps):
            bx.plot([0, 1], [r["used"]["worst-fit"], r["used"]["mell"]], "o-", color=color, alpha=0.7,
                    label=f"load {lf}" if i == 0 else None)
    bx.set_xticks([0, 1], [label for _, label in POLICIES])
    bx.set_xlim(-0.4, 1.4)
    used = [v for reps in per_load.values() for r in reps for v in r["used"].values()]
    bx.set_ylim(min(used) - 0.05 * (max(used) - min(used)), max(used) + 0.25 * (max(used) - min(used)))
    bx.set_ylabel("server-seconds used")
    bx.set_title("Each replication, paired")
    bx.legend(loc="upper center", ncols=len(per_load))
    return fig


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping intervals."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]
