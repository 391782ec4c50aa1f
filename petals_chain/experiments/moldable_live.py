"""Moldable jobs on a live swarm: the speculative width k of each session chosen by greedy(p*) from the measured load,
against fixed k = 1 and fixed maximum k; SmolLM2-135M over two loopback servers with an emulated round trip per hop
(docs/moldable.md, "Speculative width on the swarm")."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from tqdm import tqdm

from petals_chain import defaults
from petals_chain.experiments.common import REPO, Summary, mean_ci, plt, write_csv
from petals_chain.model import SpecError
from petals_chain.orchestrator.width import POLICIES, WidthChooser, policy_probabilities

NAME = "moldable_live"
MODEL = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
RTT_S = 0.25  # emulated round trip, client to each server, per step (a WAN swarm: round trips dominate)
UNITS = 8  # width units of the swarm: a session of width k holds k of them
WIDTHS = tuple(range(1, 9))
HEADROOM = defaults.TARGET_LOAD


def run(args) -> Summary:
    """Start the swarm, measure s(k), then serve each load under each policy (quick: fewer prompts, 2 loads)."""
    from transformers import AutoTokenizer

    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client
    from petals_chain.loopback.speculative_load import PROMPTS, fit_speedup, measure_speedup, serve_load
    from petals_chain.loopback.swarm import LocalSwarm, ServerPlan

    if not (MODEL / "model.safetensors").is_file():
        raise SpecError(f"model: {MODEL} is missing; run scripts/prepare_model.sh")
    if args.quick:
        prompts, new_tokens, loads, window_s = PROMPTS[:3], 24, (0.3, 0.7), 60.0
    else:
        prompts, new_tokens, loads, window_s = PROMPTS, 32, (0.2, 0.45, 0.7), 90.0
    seq = np.random.SeedSequence(args.seed)
    plans = [ServerPlan("a", "260MB"), ServerPlan("b", "260MB")]
    with tempfile.TemporaryDirectory(prefix="moldable-live-") as logs, \
            LocalSwarm(MODEL, plans, log_dir=Path(logs), model_name="SmolLM2-135M-Instruct", max_length=128,
                       arrival_rate=0.2, c=UNITS) as sw:
        sw.start(timeout_s=600)
        chains = sw.get("/chains")["chains"]
        model = AutoDistributedModelForCausalLM.from_pretrained(str(MODEL), orchestrator=sw.url,
                                                               lease_timeout_s=600.0)
        tok = AutoTokenizer.from_pretrained(str(MODEL))
        try:
            calib = measure_speedup(model, tok, WIDTHS, new_tokens, RTT_S, prompts=prompts)
            speedup = fit_speedup(calib)
            t1 = calib[0]["service_s"]
            sessions = []
            cells = []
            for load, per_load in zip(loads, seq.spawn(len(loads))):
                arrivals, *widths = per_load.spawn(1 + len(POLICIES))  # the same arrivals for every policy
                cells += [(load, policy, arrivals, w) for policy, w in zip(POLICIES, widths)]
            for load, policy, arrivals, width_seed in tqdm(cells, desc="load × policy cells"):
                rng_arrivals, rng_width = np.random.default_rng(arrivals), np.random.default_rng(width_seed)
                chooser = WidthChooser(UNITS, speedup, policy, rng_width, mean_size_s=t1,
                                       mean_interarrival_s=t1 / (load * UNITS), headroom=HEADROOM)
                rate = load * UNITS / t1
                sessions += [r.row() for r in serve_load(model, tok, chooser, load, rate, window_s, new_tokens,
                                                         RTT_S, rng_arrivals, prompts)]
        finally:
            close_client(model)
    for row in calib:
        row["fitted_speedup"] = speedup.s[row["width"] - 1] if row["width"] <= speedup.d else float("nan")
    rows = _summarise(sessions, speedup)
    write_csv(args.out / f"{NAME}.csv", rows)
    write_csv(args.out / f"{NAME}_speedup.csv", calib)
    write_csv(args.out / f"{NAME}_sessions.csv", sessions)
    _plot(calib, speedup, rows, args.out / f"{NAME}.png")
    hops = " → ".join(f"{h['server']}[{h['start']}:{h['end']}]" for h in chains[0]["spans"])
    return Summary(NAME, "speculative width by greedy(p*) on a live swarm",
                   f"python -m petals_chain.experiments moldable-live{' --quick' if args.quick else ''} "
                   f"--seed {args.seed}",
                   _lines(calib, speedup, rows, hops, new_tokens, window_s, len(prompts)),
                   data={"speedup": list(speedup.s), "rows": rows, "calibration": calib})


def _summarise(sessions: list[dict], speedup) -> list[dict]:
    """Per load and policy: sessions, mean response (95 % CI), wait, service, tokens per second, mean width."""
    rows = []
    for load in sorted({s["load"] for s in sessions}):
        for policy in POLICIES:
            mine = [s for s in sessions if s["load"] == load and s["policy"] == policy]
            if not mine:
                continue
            resp, resp_ci = mean_ci(s["response_s"] for s in mine)
            tps, tps_ci = mean_ci(s["tokens_per_s"] for s in mine)
            p = policy_probabilities(policy, speedup, load, HEADROOM)
            rows.append({"load": load, "policy": policy, "sessions": len(mine), "response_s": resp,
                         "response_ci_s": resp_ci, "wait_s": float(np.mean([s["wait_s"] for s in mine])),
                         "service_s": float(np.mean([s["service_s"] for s in mine])), "tokens_per_s": tps,
                         "tokens_per_s_ci": tps_ci, "mean_width": float(np.mean([s["width"] for s in mine])),
                         "law_mean_width": float(np.dot(np.arange(1, p.size + 1), p))})
    return rows


def _lines(calib: list[dict], speedup, rows: list[dict], hops: str, new_tokens: int, window_s: float,
           n_prompts: int) -> list[str]:
    """Headlines: s(k) measured and fitted, then per load each policy and which one wins, said plainly."""
    base = calib[0]["tokens_per_s"]
    out = [f"SmolLM2-135M, chain {hops}, emulated RTT {RTT_S * 1e3:.0f} ms per hop per step, {new_tokens} new "
           f"tokens per session, {n_prompts} prompts, prompt-lookup drafts; {UNITS} width units, headroom "
           f"ρ̄ = {HEADROOM}; Poisson arrivals for {window_s:.0f} s per cell",
           "measured s(k), k = 1..8 (tokens/s over k = 1): "
           + ", ".join(f"{r['tokens_per_s'] / base:.2f}" for r in calib)
           + "; tokens/step " + ", ".join(f"{r['tokens_per_step']:.2f}" for r in calib),
           "fitted concave s: " + ", ".join(f"{v:.2f}" for v in speedup.s)
           + (f" (cut at k = {speedup.d}: wider never helped)" if speedup.d < len(calib) else "")]
    for load in sorted({r["load"] for r in rows}):
        cell = {r["policy"]: r for r in rows if r["load"] == load}
        out.append(f"load {load:.2f}: " + "; ".join(
            f"{p} response {r['response_s']:.2f} ± {r['response_ci_s']:.2f} s (wait {r['wait_s']:.2f} s), "
            f"{r['tokens_per_s']:.2f} tok/s, width {r['mean_width']:.2f}, n = {r['sessions']}"
            for p, r in cell.items()))
        if len(cell) == len(POLICIES):
            best_fixed = min(("fixed-1", "fixed-max"), key=lambda p: cell[p]["response_s"])
            g, f = cell["greedy-p"], cell[best_fixed]
            gap = (g["response_s"] - f["response_s"]) / f["response_s"]
            if gap < -0.05:
                verdict = f"greedy(p*) helps: {-gap:.0%} lower mean response than the best fixed width ({best_fixed})"
            elif gap > 0.05:
                verdict = f"greedy(p*) does NOT help: {gap:.0%} higher mean response than {best_fixed}"
            else:
                verdict = f"greedy(p*) ties with {best_fixed} (within 5 %)"
            out.append(f"load {load:.2f}: {verdict}")
    return out


def _plot(calib: list[dict], speedup, rows: list[dict], path: Path) -> None:
    """(a) measured s(k) and its concave fit, (b) mean response time and (c) tokens per second per session
    against the load, one line per policy."""
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 3, figsize=(15, 4.5))
    k = [r["width"] for r in calib]
    base = calib[0]["tokens_per_s"]
    axes[0].plot(k, [r["tokens_per_s"] / base for r in calib], "o", label="measured tokens/s ratio")
    axes[0].plot(range(1, speedup.d + 1), speedup.s, "-", label="concave fit s(k)")
    axes[0].plot(k, [r["tokens_per_step"] for r in calib], "x:", label="tokens per step")
    axes[0].set_xlabel("width k (positions verified per step)")
    axes[0].set_title("(a) speed-up of the speculative width")
    axes[0].legend()
    for policy, style in zip(POLICIES, ("-o", "--s", ":^")):
        mine = [r for r in rows if r["policy"] == policy]
        loads = [r["load"] for r in mine]
        axes[1].errorbar(loads, [r["response_s"] for r in mine], yerr=[r["response_ci_s"] for r in mine],
                         fmt=style, capsize=3, label=policy)
        axes[2].errorbar(loads, [r["tokens_per_s"] for r in mine], yerr=[r["tokens_per_s_ci"] for r in mine],
                         fmt=style, capsize=3, label=policy)
    axes[1].set_title("(b) mean response time (wait + service)")
    axes[1].set_ylabel("seconds")
    axes[2].set_title("(c) tokens per second per session")
    for ax in axes[1:]:
        ax.set_xlabel("load λ (width-1 work per unit)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)
