"""TORTA live: three regions of SmolLM2 servers, clients from two origins behind emulated inter-region delays, a
burst that overloads one region; response times per origin under TORTA-OT, TORTA-PPO (the policy trained for these
regions by ``experiments/torta-live-train.sh``; trained here first if its checkpoint is missing), SkyLB-style and
round robin, and every answer checked against local greedy generation. Needs root (network namespaces).

Each replication draws its own arrivals (with their burst) and replays them under the four policies, one round each,
forward in even replications and backward in odd ones, so that a load drifting on the shared machine weighs on every
policy alike. The comparison is paired by arrival sequence: per replication, each policy's mean response minus
TORTA-OT's, with the 95 % interval over replications (experiments/paired.py; where it includes zero, the difference
the run could have detected). A full run keeps each replication in its checkpoint (results/resume/) with the
machine's load average, and resumes from it.

docs/torta.md, "On the swarm: regions".
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.experiments.checkpoints import append_record, read_records
from petals_chain.experiments.common import REPO, Summary, checkpoint_path, figure, mean_ci, save_figure, write_csv
from petals_chain.experiments.paired import paired
from petals_chain.loopback.regions import RegionalSwarm
from petals_chain.loopback.swarm import ServerPlan
from petals_chain.torta import live_demo

NAME = "torta-live"
MODEL_DIR = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
REGIONS, ORIGINS = list(live_demo.REGIONS), list(live_demo.ORIGINS)
LATENCY_MS, SLOTS_PER_SERVER, SLOT_S = live_demo.LATENCY_MS, live_demo.SLOTS_PER_SERVER, live_demo.SLOT_S
POLICIES = ("torta", "torta-ppo", "skylb", "rr")
LABEL = {"torta": "TORTA-OT", "torta-ppo": "TORTA-PPO", "skylb": "SkyLB-style", "rr": "round robin"}
PPO_EPISODES = 120  # as experiments/torta-live-train.sh
REPLICATIONS = 8  # full run: arrival sequences, about 3.5 min each here (four rounds)
NEW_TOKENS = 8
MAX_LENGTH = 128
TEXTS = ["The capital of France is", "Write a haiku about the sea.", "Two plus two equals",
         "List three colours:", "Once upon a time, in a small village,", "The best way to learn Python is"]


def round_order(rep: int) -> list[str]:
    """The policies' rounds in replication ``rep``: forward when even, backward when odd (ABBA over pairs)."""
    return list(POLICIES) if rep % 2 == 0 else list(reversed(POLICIES))


def replication_arrivals(seed: int, rep: int, quick: bool) -> dict[str, list[float]]:
    """Replication ``rep``'s arrivals per origin: their own stream, never one the PPO policy was trained on (those
    are the integer seeds ``seed + 1000 + k``)."""
    return live_demo.arrivals(np.random.default_rng([seed, rep]), quick)


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


def run_live(args: Any, log_dir: Path, reps: list[int], done: Callable[[dict[str, Any]], None]) -> None:
    """Start the swarm and the origins' clients, then replay each replication's arrivals under every policy;
    ``done`` gets each finished replication (its rows, round order and the machine's load average)."""
    from transformers import AutoTokenizer

    from petals_chain.protocol.blocking import request_json

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
    work = log_dir / "rounds"
    work.mkdir(parents=True, exist_ok=True)
    k = 0  # the clients' round counter (go-K.json), across replications
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
        for rep in reps:
            times = replication_arrivals(args.seed, rep, args.quick)
            rows: list[dict[str, Any]] = []
            load_before = os.getloadavg()
            for policy in round_order(rep):
                swarm_idle(swarm)
                request_json(swarm.url + "/macro/policy", data={"policy": policy})
                print(f"[{NAME}] replication {rep}: round {policy} "
                      f"({sum(len(t) for t in times.values())} requests)", flush=True)
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
                        rows.append({"rep": rep, "policy": policy, "round": k, "origin": o, "id": i,
                                     "at_s": times[o][i], "region": region, "response_s": rec["response_s"],
                                     "waited_s": rec["waited_s"], "correct": rec["tokens"] == refs[i % len(prompts)],
                                     "error": rec["error"] or ""})
                (log_dir / f"macro-{k}-{policy}.json").write_text(json.dumps(swarm.get("/macro")))
                k += 1
            done({"rep": rep, "order": round_order(rep), "rows": rows, "loadavg": [load_before, os.getloadavg()]})
        (work / f"go-{k}.json").write_text(json.dumps({"stop": True}))
        time.sleep(1.0)
    finally:
        left = swarm.stop()
        if left:
            print(f"warning: process groups still alive after teardown: {left}")


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
    """Run the replications not yet in the checkpoint (root only), then summarise: per origin and policy, and the
    paired differences by arrival sequence."""
    reps = 1 if args.quick else REPLICATIONS
    ckpt = checkpoint_path(NAME, args, __name__)
    done = _load(ckpt)
    missing = [r for r in range(reps) if r not in done]
    if missing:
        if os.geteuid() != 0:
            raise SystemExit("torta-live needs root (network namespaces for the origins)")

        def keep(rep: dict[str, Any]) -> None:
            done[rep["rep"]] = rep
            append_record(ckpt, rep)

        run_live(args, Path(tempfile.mkdtemp(prefix="torta-live-")), missing, keep)
    return summarize([done[r] for r in range(reps)], args)


def _load(path: Path | None) -> dict[int, dict[str, Any]]:
    """The replications a checkpoint holds (none without one)."""
    return {int(d["rep"]): d for d in read_records(path)}


def summarize(reps: list[dict[str, Any]], args: Any) -> Summary:
    """Per policy: every request's mean response with its interval, per origin with where r0's requests were
    served, the answers checked; then each policy against TORTA-OT paired by replication; CSV + PNG."""
    rows = [r for rep in reps for r in rep["rows"]]
    write_csv(args.out / f"{NAME}.csv", rows)
    lines, data = [], {}
    for policy in POLICIES:
        parts = []
        for o in ORIGINS:
            sel = [r for r in rows if r["policy"] == policy and r["origin"] == o and not r["error"]]
            m, h = mean_ci([r["response_s"] for r in sel])
            share = {reg: sum(r["region"] == reg for r in sel) for reg in REGIONS}
            data[f"{policy}/{o}"] = {"mean_response_s": m, "ci95_s": h, "n": len(sel), "regions": share}
            parts.append(f"origin {o}: {m:.2f} s (served in {', '.join(f'{k} {v}' for k, v in share.items())})")
        allp = [r for r in rows if r["policy"] == policy]
        ok = sum(bool(r["correct"]) for r in allp)
        errors = sum(bool(r["error"]) for r in allp)
        mall = float(np.mean([r["response_s"] for r in allp if not r["error"]]))
        data[policy] = {"mean_response_s": mall, "correct": ok, "requests": len(allp), "errors": errors}
        lines.append(f"{LABEL[policy]}: {mall:.2f} s over {len(allp)} requests; " + "; ".join(parts)
                     + f"; {ok}/{len(allp)} answers equal local greedy, {errors} errors")
    means = replication_means(reps)
    for policy in POLICIES[1:]:
        diff = paired([m[policy] - m["torta"] for m in means])
        data[f"{policy}-minus-torta"] = dataclasses.asdict(diff)
        lines.append(f"{LABEL[policy]} minus TORTA-OT, mean response paired by arrival sequence: {diff.text(' s', 2)}")
    loadavg = [rep["loadavg"][0][0] for rep in reps]
    lines.append(f"setup: regions {REGIONS}, one SmolLM2-135M server each ({SLOTS_PER_SERVER} cache slots), "
                 f"one-way latency (ms) {LATENCY_MS.tolist()}, origins {ORIGINS}, burst from r0, {NEW_TOKENS} tokens "
                 f"per request, slot {SLOT_S:g} s; {len(reps)} replication{'s' if len(reps) > 1 else ''} (arrival "
                 "sequences), each replayed under the four policies, forward in even replications and backward in "
                 f"odd ones; machine load average (1 min) at the replications' starts {min(loadavg):.2f}–"
                 f"{max(loadavg):.2f}")
    topology = live_demo.TOPOLOGY
    lines.append(f"TORTA-PPO's policy: {topology}-ep{PPO_EPISODES}.pt of experiments/torta-live-train.sh (seeded, "
                 f"{live_demo.TRAIN_SCENARIOS} live scenarios of other seeds; curve in torta-train-{topology}.png)")
    data["replications"] = means
    plot(rows, means, args.out / f"{NAME}.png")
    quick = " --quick" if args.quick else ""
    return Summary(NAME, "TORTA on a live 3-region swarm: response time per origin, paired by arrival sequence",
                   f"python -m petals_chain.experiments {NAME}{quick} --seed {args.seed}",
                   lines, ["(no live counterpart: the paper evaluates in simulation only)"], data)


def replication_means(reps: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per replication, each policy's mean response over its requests that did not fail (and the replication)."""
    out = []
    for rep in reps:
        m: dict[str, float] = {"rep": rep["rep"]}
        for policy in POLICIES:
            m[policy] = float(np.mean([r["response_s"] for r in rep["rows"]
                                       if r["policy"] == policy and not r["error"]]))
        out.append(m)
    return out


def plot(rows: list[dict[str, Any]], means: list[dict[str, float]], path: Path) -> None:
    """Draw :func:`live_figure` to ``path``."""
    save_figure(live_figure(rows, means), path)


def live_figure(rows: list[dict[str, Any]], means: list[dict[str, float]]):
    """Left: each policy's mean response per origin over all replications (95 % interval over requests). Right: per
    replication, each policy's mean minus TORTA-OT's (dots), with the paired mean and its 95 % interval."""
    fig, axes = figure(1, 2, figsize=(11.0, 4.2))
    ax, bx = axes[0]
    width = 0.2
    for j, policy in enumerate(POLICIES):
        stats = [mean_ci([r["response_s"] for r in rows if r["policy"] == policy and r["origin"] == o
                          and not r["error"]]) for o in ORIGINS]
        x = np.arange(len(ORIGINS)) + (j - 1.5) * width
        ax.bar(x, [m for m, _ in stats], width, yerr=[0 if np.isnan(h) else h for _, h in stats], capsize=3,
               label=LABEL[policy])
    ax.set_xticks(range(len(ORIGINS)), [f"origin {o}" + (" (burst)" if o == "r0" else "") for o in ORIGINS])
    ax.set_ylabel("mean response time (s)")
    ax.set_title("Per origin, all replications")
    others = POLICIES[1:]
    for j, policy in enumerate(others):
        d = np.array([m[policy] - m["torta"] for m in means])
        bx.plot(np.full(d.size, j) + np.linspace(-0.12, 0.12, d.size), d, ".", color=f"C{j + 1}", alpha=0.6)
        if d.size >= 2:
            p = paired(d)
            bx.errorbar(j + 0.3, p.mean, yerr=p.half_width, fmt="o", color=f"C{j + 1}", capsize=4)
    bx.axhline(0.0, color="0.4", lw=0.8)
    bx.set_xticks(range(len(others)), [f"{LABEL[p]}\nminus TORTA-OT" for p in others])
    bx.set_ylabel("difference of mean response (s)")
    bx.set_title("Paired by arrival sequence (dots: replications)")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside upper center", ncols=len(POLICIES))
    return fig
