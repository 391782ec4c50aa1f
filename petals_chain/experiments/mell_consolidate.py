"""Consolidation with Mell on a live loopback swarm: server-seconds used against worst fit on the same arrivals,
every output identical (docs/migration.md, "Consolidation").

Three servers each hold the whole model (SmolLM2-135M when prepared), so every chain is one server with ``c`` slots.
One Poisson replay with random output lengths runs twice on the same swarm: the orchestrator packs sessions by worst
fit (``POST /migrations {"policy": "worst-fit"}``, never moving one), then by Mell's scheduler (``"mell"``: a server
that loses a session takes one from the most recently opened server, which can then be released). A server is
counted as used while any session holds its cache (during a move, both servers).
"""

from __future__ import annotations

from collections import Counter

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.experiments.common import Summary, plt, write_csv
from petals_chain.experiments.migration_live import (
    SpeedSwarm,
    model_dir,
    poisson_arrivals,
    prompts_for,
    replay,
    server_seconds,
)
from petals_chain.loopback.swarm import ServerPlan

NAME = "mell-consolidate"
BUDGET = "437MB"  # SmolLM2-135M: 425 MB of fp32 blocks + 2 caches of 128 tokens (5.9 MB each)
POLICIES = (("worst-fit", "worst fit"), ("mell", "Mell"))
LOAD = 0.8  # of the swarm's capacity as the orchestrator measured it


def run(args: Any) -> Summary:
    """Start the swarm, replay under worst fit then Mell, write CSV + PNG, return the summary."""
    quick = bool(args.quick)
    n, lo, hi = (12, 8, 64) if quick else (30, 8, 96)
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory(prefix="mell-consolidate-") as tmp:
        mdir, mname = model_dir(quick, Path(tmp))
        plans = [ServerPlan(f"g{i}", BUDGET) for i in range(3)]
        sw = SpeedSwarm(mdir, plans, log_dir=Path(tmp) / "logs", model_name="smollm2", max_length=128,
                        arrival_rate=1.0, c=2, lease_ttl_s=30.0, heartbeat_timeout_s=60.0,
                        job_output_tokens=(lo + hi) // 2, job_input_tokens=8)
        with sw:
            print(f"[{NAME}] starting the swarm ({mname}, three whole-model servers)", flush=True)
            sw.start(timeout_s=600)
            chains = sw.get("/chains")["chains"]
            service_s = float(np.mean([c["service_time_s"] for c in chains]))
            rate = LOAD * sum(c["capacity"] for c in chains) / service_s
            arrivals = poisson_arrivals(n, rate, rng)
            new_tokens = rng.integers(lo, hi + 1, n).tolist()
            from petals_chain import AutoDistributedModelForCausalLM

            model = AutoDistributedModelForCausalLM.from_pretrained(str(mdir), orchestrator=sw.url,
                                                                   lease_timeout_s=600.0, lease_ttl_s=30.0)
            prompts = prompts_for(n, int(model.config.vocab_size), rng)
            runs: dict[str, list] = {}
            stats: dict[str, dict] = {}
            try:
                for policy, _ in POLICIES:
                    before = sw.set_policy(policy)
                    print(f"[{NAME}] replay of {n} requests at {rate:.3f}/s packed by {policy}", flush=True)
                    t0 = time.monotonic()
                    runs[policy] = replay(model, policy, arrivals, prompts, new_tokens, 128, 600.0)
                    after = sw.get("/migrations")
                    stats[policy] = {k: after[k] - before[k] for k in ("offered", "completed", "failed", "dropped")}
                    print(f"[{NAME}]   done in {time.monotonic() - t0:.1f} s", flush=True)
                    _wait_idle(sw)
            finally:
                model.orchestrator.close()
    return _summarize(runs, stats, chains, rate, mname, n, (lo, hi), args)


def _wait_idle(sw: SpeedSwarm, timeout_s: float = 120.0) -> None:
    """Until no lease is held (a packer is switched only while nothing runs)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and sw.get("/health")["active_leases"]:
        time.sleep(0.2)


def _modes(reqs: list) -> str:
    """How the requests' completed moves went, e.g. 'kv 5, token 1' (the adaptive division's picks)."""
    counts = Counter(m for r in reqs for m in r.move_modes)
    return ", ".join(f"{mode} {n}" for mode, n in sorted(counts.items())) or "none"


def _summarize(runs: dict[str, list], stats: dict[str, dict], chains: list[dict], rate: float, mname: str, n: int,
               lengths: tuple[int, int], args: Any) -> Summary:
    """Server-seconds per policy, moves, the identity check; CSV + PNG."""
    out: Path = args.out
    wf, mell = runs["worst-fit"], runs["mell"]
    errors = [r.error for r in wf + mell if r.error]
    identical = all(a.tokens == b.tokens for a, b in zip(wf, mell)) and not errors
    used = {p: server_seconds(rs) for p, rs in runs.items()}
    total = {p: sum(u.values()) for p, u in used.items()}
    span = {p: max((r.end_s for r in rs if not r.error), default=float("nan")) for p, rs in runs.items()}
    resp = {p: float(np.mean([r.response_s for r in rs if not r.error])) for p, rs in runs.items()}
    rows = []
    for p, rs in runs.items():
        for r in rs:
            row = r.row()
            row["chains"] = " ".join(f"{c}:{a:.2f}-{b:.2f}" for c, a, b in r.segments)
            rows.append(row)
    write_csv(out / f"{NAME}.csv", rows)
    _plot(out / f"{NAME}.png", runs, used)
    saving = 1.0 - total["mell"] / total["worst-fit"]
    lines = [
        f"{mname}, three whole-model servers, {len(chains)} chains of {chains[0]['capacity']} slots each; {n} Poisson "
        f"arrivals at {rate:.3f}/s, {lengths[0]}-{lengths[1]} new tokens each (uniform), the same arrivals, prompts "
        "and lengths under both packers",
        f"server-seconds used (a server counts while any session holds its cache): worst fit {total['worst-fit']:.1f} "
        f"s, Mell {total['mell']:.1f} s ({100 * abs(saving):.1f} % {'less' if saving >= 0 else 'more'}) over "
        f"replays of {span['worst-fit']:.1f} s and {span['mell']:.1f} s",
        f"moves: Mell {stats['mell']['completed']} completed ({stats['mell']['failed']} failed, "
        f"{stats['mell']['dropped']} dropped), worst fit {stats['worst-fit']['completed']}",
        f"mean response: worst fit {resp['worst-fit']:.2f} s, Mell {resp['mell']:.2f} s (moves: {_modes(mell)})",
        f"outputs identical under both packers: {identical}; errors: {len(errors)}",
    ]
    return Summary(NAME, "Consolidation by Mell on a live swarm: server-seconds against worst fit",
                   f"python -m petals_chain.experiments {NAME}{' --quick' if args.quick else ''} --seed {args.seed}",
                   lines, paper=["Mell (simulated GPU clusters): up to 31 % fewer GPUs than worst fit"],
                   data={"server_seconds": total, "per_server": used, "moves": stats, "identical": identical,
                         "errors": errors[:5]})


def _plot(path: Path, runs: dict[str, list], used: dict[str, dict[str, float]]) -> None:
    """Servers in use over time under each packer (a step function from the sessions' busy segments)."""
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6.4, 4.0))
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
        ax.step(t, y, where="post", label=f"{label} ({sum(used[policy].values()):.1f} server-s)")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("servers holding a session")
    ax.set_title("Live replay: servers in use, worst fit vs Mell")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping intervals."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]
