"""Moldable jobs on a live swarm: the speculative width k of each session chosen by greedy(p*) from the measured load,
against fixed k = 1 and fixed maximum k; SmolLM2-135M over two loopback servers with an emulated round trip per hop
(docs/moldable.md, "Speculative width on the swarm")."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import numpy as np
from tqdm import tqdm

from petals_chain import defaults
from petals_chain.experiments.common import REPO, Summary, mean_ci, plt, read_csv, replotting, write_csv
from petals_chain.model import SpecError
from petals_chain.moldable.speedup import SpeedUp, concave_hull
from petals_chain.orchestrator.width import POLICIES, WidthChooser, policy_probabilities

NAME = "moldable_live"
REPLOT = True  # `--replot` redraws moldable_live.png and its README section from the saved CSVs
MODEL = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
RTT_S = 0.25  # emulated round trip, client to each server, per step (a WAN swarm: round trips dominate)
UNITS = 8  # width units of the swarm: a session of width k holds k of them
WIDTHS = tuple(range(1, 9))
HEADROOM = defaults.TARGET_LOAD


def run(args) -> Summary:
    """Start the swarm, measure s(k), then serve each load under each policy (quick: fewer prompts, 2 loads);
    ``--replot`` redraws the PNG and the README section from the saved CSVs."""
    if args.quick:
        n_prompts, new_tokens, loads, window_s = 3, 24, (0.3, 0.7), 60.0
    else:
        n_prompts, new_tokens, loads, window_s = 6, 32, (0.2, 0.45, 0.7), 90.0
    settings = (new_tokens, window_s, n_prompts)
    if replotting(args):
        chain = _saved_chain(args.out / f"{NAME}.json")
        return _report(args, read_csv(args.out / f"{NAME}_speedup.csv"),
                       read_csv(args.out / f"{NAME}_sessions.csv"), chain, settings)
    calib, sessions, chain = _live(args, n_prompts, new_tokens, loads, window_s)
    return _report(args, calib, sessions, chain, settings)


def _live(args, n_prompts: int, new_tokens: int, loads: tuple[float, ...],
          window_s: float) -> tuple[list[dict], list[dict], str]:
    """The live part: swarm up, s(k) calibration, every (load, policy) cell; the rows and the chain served."""
    from transformers import AutoTokenizer

    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client
    from petals_chain.loopback.speculative_load import PROMPTS, measure_speedup, serve_load
    from petals_chain.loopback.swarm import LocalSwarm, ServerPlan

    if not (MODEL / "model.safetensors").is_file():
        raise SpecError(f"model: {MODEL} is missing; run scripts/prepare_model.sh")
    prompts = PROMPTS[:n_prompts]
    seq = np.random.SeedSequence(args.seed)
    plans = [ServerPlan("a", "260MB"), ServerPlan("b", "260MB")]
    with tempfile.TemporaryDirectory(prefix="moldable-live-") as logs, \
            LocalSwarm(MODEL, plans, log_dir=Path(logs), model_name="SmolLM2-135M-Instruct", max_length=128,
                       arrival_rate=0.2, c=UNITS) as sw:
        sw.start(timeout_s=600)
        spans = sw.get("/chains")["chains"][0]["spans"]
        model = AutoDistributedModelForCausalLM.from_pretrained(str(MODEL), orchestrator=sw.url,
                                                               lease_timeout_s=600.0)
        tok = AutoTokenizer.from_pretrained(str(MODEL))
        try:
            calib = measure_speedup(model, tok, WIDTHS, new_tokens, RTT_S, prompts=prompts)
            speedup = fit(calib)
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
    return calib, sessions, " → ".join(f"{h['server']}[{h['start']}:{h['end']}]" for h in spans)


def _saved_chain(path: Path) -> str:
    """The chain a saved run served ('a[0:16] → b[16:30]'), from its JSON ('?' when unknown)."""
    if not path.is_file():
        return "?"
    saved = json.loads(path.read_text())
    if "chain" in saved.get("data", {}):
        return saved["data"]["chain"]
    match = re.search(r"chain (.+?), emulated", (saved.get("lines") or [""])[0])
    return match.group(1) if match else "?"


def fit(calib: list[dict]) -> SpeedUp:
    """The concave hull of the measured tokens per second, normalised to width 1."""
    return concave_hull([int(r["width"]) for r in calib], [r["tokens_per_s"] for r in calib])


def _report(args, calib: list[dict], sessions: list[dict], chain: str, settings: tuple[int, float, int]) -> Summary:
    """Fit, summarise, write the CSVs (not when replotting) and the PNG; the Summary for results/README.md."""
    speedup = fit(calib)
    for row in calib:
        w = int(row["width"])
        row["fitted_speedup"] = speedup.s[w - 1] if w <= speedup.d else float("nan")
    rows = _summarise(sessions, speedup)
    if not replotting(args):
        write_csv(args.out / f"{NAME}_speedup.csv", calib)
        write_csv(args.out / f"{NAME}_sessions.csv", sessions)
    write_csv(args.out / f"{NAME}.csv", rows)
    _plot(calib, speedup, rows, args.out / f"{NAME}.png")
    return Summary(NAME, "speculative width by greedy(p*) on a live swarm",
                   f"python -m petals_chain.experiments moldable-live{' --quick' if args.quick else ''} "
                   f"--seed {args.seed}", _lines(calib, speedup, rows, chain, *settings),
                   data={"speedup": list(speedup.s), "chain": chain, "rows": rows, "calibration": calib})


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
    acc = [r["accept_rate"] for r in calib[1:]]
    n_hops = hops.count("→") + 1
    step_s = calib[0]["service_s"] / new_tokens
    out.append(f"drafts kept {min(acc):.0%}–{max(acc):.0%} of the time (k = 2..8), at most "
               f"{max(r['tokens_per_step'] for r in calib):.2f} tokens per step, so the best fitted speed-up is "
               f"{speedup.s[-1]:.2f}; a width-1 step took {step_s:.2f} s, of which {n_hops * RTT_S:.2f} s emulated "
               "round trips (the rest is compute on the shared CPUs, which grows with k)")
    for load in sorted({r["load"] for r in rows}):
        cell = {r["policy"]: r for r in rows if r["load"] == load}
        out.append(f"load {load:.2f}: " + "; ".join(
            f"{p} response {r['response_s']:.2f} ± {r['response_ci_s']:.2f} s (wait {r['wait_s']:.2f} s), "
            f"{r['tokens_per_s']:.2f} tok/s, width {r['mean_width']:.2f}, n = {r['sessions']}"
            for p, r in cell.items()))
        if len(cell) == len(POLICIES):
            out.append(f"load {load:.2f}: {verdict(cell)}")
            top = cell["fixed-max"]
            out.append(f"load {load:.2f}: fixed width {top['mean_width']:.0f} waited {top['wait_s']:.1f} s on average "
                       f"(greedy(p*) {cell['greedy-p']['wait_s']:.1f} s, fixed 1 {cell['fixed-1']['wait_s']:.1f} s)")
    return out


def verdict(cell: dict[str, dict]) -> str:
    """greedy(p*) against the better fixed width at one load, by mean response time: 'helps' or 'does NOT help'
    only when the difference exceeds the two 95 % intervals combined (NaN intervals count as unknown: no verdict)."""
    best = min(("fixed-1", "fixed-max"), key=lambda p: cell[p]["response_s"])
    g, f = cell["greedy-p"], cell[best]
    diff = g["response_s"] - f["response_s"]
    noise = float(np.hypot(g["response_ci_s"], f["response_ci_s"]))
    rel = diff / f["response_s"]
    if abs(g["mean_width"] - f["mean_width"]) < 0.05:
        return (f"greedy(p*) ran the widths {best} runs (mean {g['mean_width']:.2f}): the {rel:+.0%} between them "
                "is the shared machine's noise, not the width")
    if not np.isfinite(noise):
        return f"too few sessions to compare greedy(p*) with {best} ({rel:+.0%} mean response)"
    if diff < -noise:
        return f"greedy(p*) helps: {-rel:.0%} lower mean response than the better fixed width ({best})"
    if diff > noise:
        return f"greedy(p*) does NOT help: {rel:.0%} higher mean response than {best}"
    return f"no clear difference between greedy(p*) and {best} ({rel:+.0%}, within the 95 % intervals)"


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
