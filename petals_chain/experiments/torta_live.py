"""TORTA live: three regions of SmolLM2 servers, clients from two origins behind emulated inter-region delays, a
burst that overloads one region; response times per origin under TORTA-OT, TORTA-PPO (the policy trained for these
regions by ``experiments/torta-live-train.sh``; trained here first if its checkpoint is missing), SkyLB-style and
round robin on the same arrivals, and every answer checked against local greedy generation. Needs root (network
namespaces).

docs/torta.md, "On the swarm: regions".
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.experiments.common import REPO, Summary, mean_ci, plt, write_csv
from petals_chain.loopback.regions import RegionalSwarm
from petals_chain.loopback.swarm import ServerPlan
from petals_chain.torta import live_demo

MODEL_DIR = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
REGIONS, ORIGINS = list(live_demo.REGIONS), list(live_demo.ORIGINS)
LATENCY_MS, SLOTS_PER_SERVER, SLOT_S = live_demo.LATENCY_MS, live_demo.SLOTS_PER_SERVER, live_demo.SLOT_S
POLICIES = ("torta", "torta-ppo", "skylb", "rr")
LABEL = {"torta": "TORTA-OT", "torta-ppo": "TORTA-PPO", "skylb": "SkyLB-style", "rr": "round robin"}
PPO_EPISODES = 120  # as experiments/torta-live-train.sh


def round_order(quick: bool) -> list[str]:
    """The policies' rounds: once each with --quick, else forward then backward (ABBA), so that a load that drifts
    on the shared machine while the rounds run one after the other weighs on every policy alike."""
    return list(POLICIES) if quick else [*POLICIES, *reversed(POLICIES)]
NEW_TOKENS = 8
MAX_LENGTH = 128
TEXTS = ["The capital of France is", "Write a haiku about the sea.", "Two plus two equals",
         "List three colours:", "Once upon a time, in a small village,", "The best way to learn Python is"]


def ppo_checkpoint(out: Path, seed: int) -> Path:
    """The live regions' PPO checkpoint (as experiments/torta-live-train.sh writes it); trained now if missing."""
    path = out / "checkpoints" / f"{live_demo.TOPOLOGY}-ep{PPO_EPISODES}.pt"
    if not path.exists():
        from petals_chain.experiments.torta_train import main as train_main

        train_main(["--topology", live_demo.TOPOLOGY, "--episodes", str(PPO_EPISODES), "--seed", str(seed),
                    "--out", str(out)])
    return path


def references(prompts: list[list[int]]) -> list[list[int]]:
    """Local transformers' greedy continuation of every prompt (the ground truth)."""
    import torch
    from transformers import AutoModelForCausalLM

    local = AutoModelForCausalLM.from_pretrained(str(MODEL_DIR), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return [local.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                               do_sample=False)[0].tolist() for p in prompts]


def wait_file(path: Path, timeout_s: float, procs: list[Any]) -> None:
    """Until ``path`` exists; RuntimeError if a client process died or time ran out."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        for p in procs:
            if p.popen.poll() is not None:
                raise RuntimeError(f"client {p.name} exited:\n{p.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {path.name}")
        time.sleep(0.2)


def run_live(args: Any, log_dir: Path) -> list[dict[str, Any]]:
    """Start the swarm and the origins' clients, replay the same arrivals under each policy, collect records."""
    from transformers import AutoTokenizer

    rng = np.random.default_rng(args.seed)
    times = live_demo.arrivals(rng, args.quick)
    tok = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    prompts = [tok(t).input_ids for t in TEXTS]
    refs = references(prompts)
    from petals_chain.checkpoint.sizing import block_sizes

    sizes = block_sizes(MODEL_DIR, "float32", MAX_LENGTH)
    budget = sizes.num_blocks * (sizes.block_bytes + (SLOTS_PER_SERVER + 0.5) * sizes.cache_bytes)
    regions = {r: [ServerPlan(f"{r}-s0", f"{budget:.0f}B", ("--reserve", "0"))] for r in REGIONS}
    swarm = RegionalSwarm(MODEL_DIR, regions, LATENCY_MS * 1e-3, ORIGINS, log_dir=log_dir, policy="torta",
                          slot_s=SLOT_S, model_name="SmolLM2-135M-Instruct", max_length=MAX_LENGTH,
                          c=SLOTS_PER_SERVER, arrival_rate=0.5, lease_ttl_s=60.0, heartbeat_timeout_s=60.0,
                          job_input_tokens=16, job_output_tokens=NEW_TOKENS,
                          orchestrator_args=("--ppo-checkpoint", str(ppo_checkpoint(args.out, args.seed))))
    rows: list[dict[str, Any]] = []
    work = log_dir / "rounds"
    work.mkdir(parents=True, exist_ok=True)
    try:
        swarm.start(timeout_s=400)
        clients = [swarm.run_in(o, f"client-{o}", [
            "-m", "petals_chain.loopback.region_client", str(MODEL_DIR), "--orchestrator", swarm.origin_url(o),
            "--origin", o, "--initial-peers", *swarm.initial_peers(o), "--dir", str(work),
            "--max-length", str(MAX_LENGTH), "--servers", str(len(REGIONS))]) for o in ORIGINS]
        deadline = time.monotonic() + 300
        while not all("loaded" in c.log_path.read_text(errors="replace") for c in clients):
            if time.monotonic() > deadline or any(c.popen.poll() is not None for c in clients):
                raise RuntimeError("clients did not load:\n" + "\n".join(c.log_tail() for c in clients))
            time.sleep(0.5)
        order = round_order(args.quick)
        for k, policy in enumerate(order):
            swarm_idle(swarm)
            from petals_chain.protocol.blocking import request_json

            request_json(swarm.url + "/macro/policy", data={"policy": policy})
            start = time.time() + 2.0
            reqs = {o: [{"id": i, "at_s": t, "prompt": prompts[i % len(prompts)], "new_tokens": NEW_TOKENS}
                        for i, t in enumerate(times[o])] for o in ORIGINS}
            # one go-file per round, read by every client: each takes its own origin's list
            (work / f".go-{k}.json").write_text(json.dumps({"start_epoch": start, "by_origin": reqs}))
            (work / f".go-{k}.json").rename(work / f"go-{k}.json")
            for o in ORIGINS:
                wait_file(work / f"out-{k}-{o}.json", 600, clients)
                for rec in json.loads((work / f"out-{k}-{o}.json").read_text()):
                    i = rec["id"]
                    region = swarm.region_of.get(rec["servers"][0]) if rec["servers"] else None
                    rows.append({"policy": policy, "round": k, "origin": o, "id": i, "at_s": times[o][i],
                                 "region": region, "response_s": rec["response_s"], "waited_s": rec["waited_s"],
                                 "correct": rec["tokens"] == refs[i % len(prompts)], "error": rec["error"] or ""})
            rows_macro = swarm.get("/macro")
            (log_dir / f"macro-{k}-{policy}.json").write_text(json.dumps(rows_macro))
        (work / f"go-{len(order)}.json").write_text(json.dumps({"stop": True}))
        time.sleep(1.0)
    finally:
        left = swarm.stop()
        if left:
            print(f"warning: process groups still alive after teardown: {left}")
    return rows


def swarm_idle(swarm: RegionalSwarm, timeout_s: float = 120.0) -> None:
    """Until no lease is held or waiting, and the macro layer's history has emptied (a fresh start per policy)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        h = swarm.get("/health")
        if h["active_leases"] == 0 and h["queue_length"] == 0:
            break
        time.sleep(0.5)
    time.sleep(4 * SLOT_S)  # the forecast (mean of the last slots) forgets the previous round


def run(args: Any) -> Summary:
    """Run the live comparison (root only) and summarise response times per origin and policy."""
    if os.geteuid() != 0:
        raise SystemExit("torta-live needs root (network namespaces for the origins)")
    log_dir = Path(tempfile.mkdtemp(prefix="torta-live-"))
    rows = run_live(args, log_dir)
    write_csv(args.out / "torta-live_demo.csv", rows)
    lines, data = [], {}
    for policy in POLICIES:
        parts = []
        for o in ORIGINS:
            sel = [r for r in rows if r["policy"] == policy and r["origin"] == o and not r["error"]]
            m, h = mean_ci([r["response_s"] for r in sel])
            share = {reg: sum(r["region"] == reg for r in sel) for reg in REGIONS}
            data[f"{policy}/{o}"] = {"mean_response_s": m, "ci95_s": h, "n": len(sel), "regions": share}
            parts.append(f"origin {o}: {m:.2f} ± {h:.2f} s (n = {len(sel)}, served in "
                         f"{', '.join(f'{k} {v}' for k, v in share.items())})")
        allp = [r for r in rows if r["policy"] == policy]
        ok = sum(bool(r["correct"]) for r in allp)
        mall, hall = mean_ci([r["response_s"] for r in allp if not r["error"]])
        data[policy] = {"mean_response_s": mall, "ci95_s": hall, "correct": ok, "requests": len(allp)}
        lines.append(f"{LABEL[policy]}: all {mall:.2f} ± {hall:.2f} s; " + "; ".join(parts)
                     + f"; {ok}/{len(allp)} answers equal local greedy")
    plot(rows, args.out / "torta-live_demo.png")
    rounds = sorted({r["round"] for r in rows})
    lines.append("rounds in order (mean response): " + ", ".join(
        f"{LABEL[next(r['policy'] for r in rows if r['round'] == k)]} "
        f"{np.mean([r['response_s'] for r in rows if r['round'] == k and not r['error']]):.2f} s" for k in rounds))
    lines.append(f"setup: regions {REGIONS}, one SmolLM2-135M server each ({SLOTS_PER_SERVER} cache slots), "
                 f"one-way latency (ms) {LATENCY_MS.tolist()}, origins {ORIGINS}, burst from r0, {NEW_TOKENS} tokens "
                 f"per request, slot {SLOT_S:g} s; rounds "
                 f"{'once each' if args.quick else 'forward then backward (ABBA)'}; 95 % Student-t CIs over requests")
    topology = live_demo.TOPOLOGY
    lines.append(f"TORTA-PPO's policy: {topology}-ep{PPO_EPISODES}.pt of experiments/torta-live-train.sh (seeded, "
                 f"{live_demo.TRAIN_SCENARIOS} live scenarios of other seeds; curve in torta-train-{topology}.png)")
    quick = " --quick" if args.quick else ""
    return Summary("torta-live", "TORTA on a live 3-region swarm: response time per origin",
                   f"python -m petals_chain.experiments torta-live{quick} --seed {args.seed}",
                   lines, ["(no live counterpart: the paper evaluates in simulation only)"], data)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Mean response time per origin and policy (95 % CI), and where each policy served origin r0's requests."""
    pyplot = plt()
    fig, (ax, bx) = pyplot.subplots(1, 2, figsize=(12, 4))
    width = 0.2
    for j, policy in enumerate(POLICIES):
        stats = [mean_ci([r["response_s"] for r in rows if r["policy"] == policy and r["origin"] == o
                          and not r["error"]]) for o in ORIGINS]
        x = np.arange(len(ORIGINS)) + (j - 1.5) * width
        ax.bar(x, [m for m, _ in stats], width, yerr=[0 if np.isnan(h) else h for _, h in stats], capsize=3,
               label=LABEL[policy])
        counts = [sum(1 for r in rows if r["policy"] == policy and r["origin"] == "r0" and r["region"] == reg)
                  for reg in REGIONS]
        bx.bar(np.arange(len(REGIONS)) + (j - 1.5) * width, counts, width, label=LABEL[policy])
    ax.set_xticks(range(len(ORIGINS)), [f"origin {o}" for o in ORIGINS])
    ax.set_ylabel("mean response time (s)")
    ax.legend()
    bx.set_xticks(range(len(REGIONS)), [f"served in {r}" for r in REGIONS])
    bx.set_ylabel("requests of origin r0")
    bx.legend()
    fig.suptitle("TORTA live: 3 regions, burst from r0")
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)
