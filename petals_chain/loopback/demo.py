"""``python -m petals_chain.loopback.demo``: a live orchestrated swarm on loopback, end to end, in a few minutes.

Starts the orchestrator (with its DHT) and servers with different memory budgets,
prints the composition the orchestrator chose for them (placement, chains, c_k, T_k),
sends a burst of concurrent real prompts through leased chains, prints each answer
with its waiting time, service time and chain, writes CSV/JSON/PNG and the processes' logs
to a fresh run folder (``runs/demo-<UTC time>/``, ignored by git, so the tree stays clean),
and tears every process group down (checking that none is left).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from petals_chain import defaults
from petals_chain.model import SpecError, span_text
from petals_chain.client.model import close_client
from petals_chain.loopback.swarm import LocalSwarm, ServerPlan, group_members

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
RUNS_DIR = REPO / "runs"  # git-ignored: every demo run gets its own folder here
QUESTIONS = (
    "What is the capital of France?",
    "Name the three primary colors.",
    "What is 12 times 12?",
    "Who wrote Romeo and Juliet?",
    "Which planet is known as the Red Planet?",
    "What is the largest ocean on Earth?",
    "How many days are in a leap year?",
    "What gas do plants absorb from the air?",
    "Translate 'thank you' into Spanish.",
    "What is the boiling point of water in Celsius?",
    "Give a synonym for 'happy'.",
    "What is the chemical symbol for gold?",
)


def parse_servers(text: str) -> list[ServerPlan]:
    """'s1=600MB,s2=350MB' → ServerPlans; SpecError naming the bad item."""
    plans = []
    for item in text.split(","):
        name, sep, budget = item.strip().partition("=")
        if not sep or not name or not budget:
            raise SpecError(f"--servers item {item!r} must be NAME=BUDGET, e.g. s1=600MB")
        plans.append(ServerPlan(name.strip(), budget.strip()))
    if not 1 <= len(plans) <= 4:
        raise SpecError(f"--servers: give 1 to 4 servers (each takes ~1-1.5 GB of RAM), got {len(plans)}")
    return plans


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.loopback.demo", description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", default=str(DEFAULT_MODEL), help="checkpoint (default: SmolLM2-135M-Instruct)")
    p.add_argument("--servers", default="s1=600MB,s2=350MB,s3=300MB,s4=250MB",
                   help="NAME=BUDGET,... (M_j of each server; 1-4 servers)")
    p.add_argument("--max-length", type=int, default=1024, help="tokens per job the KV cache is sized for (s_c)")
    p.add_argument("--arrival-rate", type=float, default=2.0, help="λ the orchestrator composes for, requests/s")
    p.add_argument("--c", type=int, default=3,
                   help="reserved concurrency c of GBP-CR (default 3: several chains of different speed whatever "
                        "this shared CPU measures; 0 lets the orchestrator tune c by the Theorem 3.7 bound)")
    p.add_argument("--prompts", type=int, default=None,
                   help="concurrent requests in the burst (default: total capacity + 4, so that some must queue)")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--out", default=None,
                   help="directory for CSV/JSON/PNG and logs (default: a fresh runs/demo-<UTC time>/)")
    p.add_argument("--quick", action="store_true", help="fewer new tokens (12) per prompt")
    return p.parse_args(argv)


def fresh_run_dir(root: Path = RUNS_DIR, now: datetime | None = None) -> Path:
    """A new, empty folder ``root/demo-YYYYmmdd-HHMMSS`` (UTC; ``-2``, ``-3``... if that second is taken)."""
    stamp = (now or datetime.now(timezone.utc)).strftime("demo-%Y%m%d-%H%M%S")
    for k in range(1, 1000):
        path = root / (stamp if k == 1 else f"{stamp}-{k}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise SpecError(f"no free run folder for {stamp} under {root}")


def say(t0: float, text: str) -> None:
    """A timestamped progress line."""
    print(f"[{time.monotonic() - t0:6.1f} s] {text}", flush=True)


def print_composition(sw: LocalSwarm) -> dict[str, Any]:
    """Print servers (budget, τp, τc, span, cache slots) and chains (route, c_k, T_k); return what was printed."""
    servers = sw.get("/servers")["servers"]
    chains = sw.get("/chains")["chains"]
    health = sw.get("/health")
    sizes = sw.sizes
    print(f"\ncomposition v{health['version']}: c = {health['c']}, {len(chains)} chains, total capacity "
          f"{health['capacity']} (model: {sizes.num_blocks} blocks, s_m = {sizes.block_bytes / 1e6:.2f} MB, "
          f"s_c = {sizes.cache_bytes / 1e6:.3f} MB per block-job at {sizes.max_length} tokens)")
    print(f"  {'server':8} {'M_j':>9} {'tau_p/blk':>10} {'tau_c':>7} {'blocks':>8} {'cache slots':>12}")
    for r in servers:
        a = r["assignment"]
        m = a["num_blocks"] if a else 0
        span = span_text(a["start"], a["end"]) if m else "-"
        slots = sizes.cache_slots(r["memory_bytes"], m) if m else 0
        print(f"  {r['name']:8} {r['memory_bytes'] / 1e6:7.0f}MB {r['tau_p_s'] * 1e3:8.1f}ms {r['tau_c_s']:6.3f}s "
              f"{span:>8} {slots:12d}")
    print(f"  {'chain':7} {'route':44} {'c_k':>4} {'T_k':>7}")
    for c in sorted(chains, key=lambda c: c["service_time_s"]):
        route = " -> ".join(f"{s['server']}[{span_text(s['start'], s['end'])}]" for s in c["spans"])
        print(f"  {c['chain_id']:7} {route:44} {c['capacity']:4d} {c['service_time_s']:6.2f}s")
    print()
    return {"health": health, "servers": servers, "chains": chains}


def run_burst(model: Any, tok: Any, questions: Sequence[str], max_new_tokens: int, t0: float) -> list[dict]:
    """Send every question at once (one thread and one leased session each); return per-request rows."""
    import torch

    rows: list[dict] = [{} for _ in questions]
    start = threading.Barrier(len(questions))
    tok_lock = threading.Lock()  # a fast tokenizer must not be used by two threads at once ("Already borrowed")
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       return_tensors="pt") for q in questions]

    def one(i: int, q: str) -> None:
        """One request: lease, generate, decode, record (errors are recorded, not raised)."""
        ids = prompts[i]
        start.wait()
        sent = time.monotonic()
        try:
            with model.inference_session(max_length=ids.shape[1] + max_new_tokens) as s:
                with torch.no_grad():
                    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, session=s)
            with tok_lock:
                answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
            rec = s.record
            rows[i] = {"request": i, "question": q, "answer": answer, "lease_id": rec.lease_id, "chain": rec.chain_id,
                       "route": rec.route(),
                       "sent_s": sent - t0, "waiting_s": rec.waited_s, "queue_waiting_s": rec.queue_waited_s,
                       "service_s": rec.service_s, "response_s": rec.response_s,
                       "new_tokens": int(out.shape[1] - ids.shape[1]), "error": ""}
        except Exception as exc:  # reported in the table, never silently dropped
            log.warning("request %d failed", i, exc_info=True)  # the traceback goes to the run's log
            rows[i] = {"request": i, "question": q, "answer": "", "lease_id": "", "chain": "", "route": "",
                       "sent_s": sent - t0,
                       "waiting_s": None, "queue_waiting_s": None, "service_s": None, "response_s": None,
                       "new_tokens": 0, "error": f"{type(exc).__name__}: {exc}"}
        r = rows[i]
        if r["error"]:
            say(t0, f"request {i:2d} FAILED: {r['error']}")
        else:
            say(t0, f"request {i:2d} chain {r['chain']:6} wait {r['waiting_s']:5.2f} s  service "
                    f"{r['service_s']:5.2f} s  {r['route']}\n             Q: {q}\n             A: {r['answer']!r}")

    threads = [threading.Thread(target=one, args=(i, q), daemon=True) for i, q in enumerate(questions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    return rows


def arrival_key(row: dict) -> tuple[float, float]:
    """Sort key: the orchestrator's job number (lease ids are 'L<job>-<random>'), else the client's grant time."""
    m = re.match(r"L(\d+)-", row.get("lease_id") or "")
    return (float(m.group(1)) if m else math.inf, row["sent_s"] + (row["waiting_s"] or 0.0))


def write_outputs(out: Path, rows: list[dict], summary: dict) -> list[Path]:
    """CSV of requests, JSON summary, PNG timeline (waiting grey, service coloured by chain)."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, json_path, png_path = out / "demo_requests.csv", out / "demo_summary.json", out / "demo_timeline.png"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    json_path.write_text(json.dumps(summary, indent=2, default=str))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chains = sorted({r["chain"] for r in rows if r["chain"]})
    colors = {c: plt.cm.tab10(k % 10) for k, c in enumerate(chains)}
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.5))
    for r in rows:
        if r["error"]:
            continue
        t = r["sent_s"]
        ax.barh(r["request"], r["waiting_s"], left=t, color="0.8")
        ax.barh(r["request"], r["service_s"], left=t + r["waiting_s"], color=colors[r["chain"]])
    from matplotlib.patches import Patch

    handles = [Patch(color=colors[c], label=f"served on {c}") for c in chains]
    handles.append(Patch(color="0.8", label="waiting (queue)"))
    ax.set_xlabel("seconds since the demo started")
    ax.set_ylabel("request")
    ax.invert_yaxis()
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    ax.set_title("Burst through JFFC-leased chains")
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return [csv_path, json_path, png_path]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; exit 2 on bad input, 1 if a request failed or a process was left behind."""
    args = parse_args(argv)
    t0 = time.monotonic()
    try:
        plans = parse_servers(args.servers)
        if args.c < 0:
            raise SpecError(f"--c must be >= 0 (0: tuned), got {args.c}")
        new_tokens = 12 if args.quick else args.max_new_tokens
        if args.prompts is not None and not 1 <= args.prompts <= 64:
            raise SpecError(f"--prompts must be in 1..64, got {args.prompts}")
        out = Path(args.out) if args.out else fresh_run_dir()
        sw = LocalSwarm(args.model_dir, plans, log_dir=out / "logs",
                        model_name=Path(args.model_dir).name, max_length=args.max_length,
                        arrival_rate=args.arrival_rate, c=args.c or None, job_input_tokens=48,
                        job_output_tokens=new_tokens, size_from_model=True)
    except (SpecError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ok = True
    main_pid = os.getpid()

    def on_signal(signum: int, frame: Any) -> None:
        """In the demo process: unwind like Ctrl-C so that the swarm is torn down; forked children ignore it."""
        if os.getpid() == main_pid:
            raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    model = None
    try:
        say(t0, f"run folder {out} (results and logs)")
        say(t0, "starting the orchestrator and its DHT")
        url = sw.start_orchestrator()
        say(t0, f"orchestrator at {url}; starting {len(plans)} servers: "
                + ", ".join(f"{p.name} (M = {p.memory_budget})" for p in plans))
        for plan in plans:
            sw.start_server(plan)
        sw.wait_ready([p.name for p in plans], timeout_s=420)
        say(t0, "every server serves its assigned blocks")
        composition = print_composition(sw)
        capacity = composition["health"]["capacity"]
        n = args.prompts if args.prompts is not None else min(64, capacity + 4)
        questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(n)]

        from transformers import AutoTokenizer

        from petals_chain import AutoDistributedModelForCausalLM

        tok = AutoTokenizer.from_pretrained(args.model_dir)
        model = AutoDistributedModelForCausalLM.from_pretrained(args.model_dir, orchestrator=url,
                                                               lease_timeout_s=defaults.LEASE_WAIT_S)
        say(t0, f"client loaded; sending {n} prompts at once (capacity {capacity}: {max(0, n - capacity)} must queue)")
        burst_t = time.monotonic()
        rows = run_burst(model, tok, questions, new_tokens, t0)
        burst_s = time.monotonic() - burst_t
        close_client(model)
        model = None
        served = [r for r in rows if not r["error"]]
        ok = len(served) == n
        per_chain = Counter(r["chain"] for r in served)
        health = sw.get("/health")
        print()
        say(t0, f"burst done in {burst_s:.1f} s: {len(served)}/{n} served; per chain: "
                + ", ".join(f"{c}: {k}" for c, k in sorted(per_chain.items())))
        order = sorted(served, key=arrival_key)
        say(t0, "JFFC, chain of each request in its arrival order at the orchestrator (fastest free chain first; "
                "'*' = queued first): " + " ".join(r["chain"] + ("*" if r["queue_waiting_s"] > 0.05 else "")
                                                   for r in order))
        if served:
            waits = [r["waiting_s"] for r in served]
            services = [r["service_s"] for r in served]
            say(t0, f"waiting mean {sum(waits) / len(waits):.2f} s (max {max(waits):.2f} s), service mean "
                    f"{sum(services) / len(services):.2f} s; after the burst: {health['free']}/{health['capacity']} "
                    f"slots free, queue {health['queue_length']}")
        model_dir = Path(args.model_dir).resolve()
        shown_dir = model_dir.relative_to(REPO) if model_dir.is_relative_to(REPO) else model_dir
        summary = {"model_dir": str(shown_dir), "servers": [p.__dict__ for p in plans],
                   "composition": composition, "burst_s": burst_s, "per_chain": per_chain,
                   "requests": rows, "after": health}
        for path in write_outputs(out, rows, summary):
            say(t0, f"wrote {path}")
    except KeyboardInterrupt:
        say(t0, "interrupted")
        ok = False
    except Exception as exc:  # the swarm still gets torn down below
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        ok = False
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second Ctrl-C must not cut teardown short
            signal.signal(sig, signal.SIG_IGN)
        if model is not None:
            close_client(model)
        say(t0, f"stopping {len(sw.procs)} process groups")
        left = sw.stop()
        still = [pg for pg in sw.started_pgids if group_members(pg)]
        if left or still:
            say(t0, f"WARNING: processes left in groups {sorted(set(left + still))}")
            ok = False
        else:
            say(t0, f"all {len(sw.started_pgids)} process groups are gone (no orphan processes); "
                    f"total {time.monotonic() - t0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
