"""Moldable jobs on a live swarm: the speculative width k of each session chosen by the orchestrator in its lease reply,
by greedy(p*) from the load it measures, against fixed k = 1 and fixed maximum k; SmolLM2-135M over two loopback
servers with an emulated round trip per hop (docs/moldable.md, "Speculative width on the swarm", "Width through the
lease API")."""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from petals_chain import defaults
from petals_chain.experiments.common import REPO, Summary, mean_ci, read_csv, replotting, save_figure, write_csv
from petals_chain.model import SpecError
from petals_chain.moldable.speedup import SpeedUp, concave_hull
from petals_chain.moldable.live import POLICIES, policy_probabilities

NAME = "moldable_live"
REPLOT = True  # `--replot` redraws moldable_live.png and its README section from the saved CSVs
MODEL = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
RTT_S = 0.25  # emulated round trip, client to each server, per step (a WAN swarm: round trips dominate)
UNITS = 8  # width units of the swarm: a session of width k holds k of them
WIDTHS = tuple(range(1, 9))
HEADROOM = defaults.TARGET_LOAD


def run(args) -> Summary:
    """Measure s(k) (a --quick run reuses the profile saved by an earlier run, if any), start the swarm whose
    orchestrator chooses widths from that profile, then serve each load under each policy (quick: fewer prompts, 2
    loads); ``--replot`` redraws the PNG and the README section from the saved CSVs."""
    if args.quick:
        n_prompts, new_tokens, loads, window_s = 3, 24, (0.3, 0.7), 60.0
    else:
        n_prompts, new_tokens, loads, window_s = 6, 32, (0.2, 0.45, 0.7), 90.0
    settings = (new_tokens, window_s, n_prompts)
    if replotting(args):
        chain = _saved_chain(args.out / f"{NAME}.json")
        return _report(args, read_csv(args.out / f"{NAME}_speedup.csv"),
                       read_csv(args.out / f"{NAME}_sessions.csv"), chain, settings,
                       reused=_saved_reuse(args.out / f"{NAME}.json"))
    profile = args.out / f"{NAME}_speedup.csv"
    reused = args.quick and profile.is_file()
    calib = read_csv(profile) if reused else _calibrate(n_prompts, new_tokens)
    for row in calib:
        row["width"] = int(row["width"])
    if not reused:
        write_csv(profile, calib)
    sessions, chain = _live(args, profile, calib[0]["service_s"], new_tokens, loads, window_s, _prompts(n_prompts))
    return _report(args, calib, sessions, chain, settings, reused=reused)


def _prompts(n: int) -> tuple[str, ...]:
    """The first ``n`` prompts of the load generator."""
    from petals_chain.loopback.speculative_load import PROMPTS

    return PROMPTS[:n]


def _swarm(logs: Path, extra: tuple[str, ...] = ()):
    """The loopback swarm of this experiment: two SmolLM2 servers, one chain of UNITS slots."""
    from petals_chain.loopback.swarm import LocalSwarm, ServerPlan

    if not (MODEL / "model.safetensors").is_file():
        raise SpecError(f"model: {MODEL} is missing; run scripts/prepare_model.sh")
    plans = [ServerPlan("a", "260MB"), ServerPlan("b", "260MB")]
    return LocalSwarm(MODEL, plans, log_dir=logs, model_name="SmolLM2-135M-Instruct", max_length=128,
                      arrival_rate=0.2, c=UNITS, orchestrator_args=extra)


def _calibrate(n_prompts: int, new_tokens: int) -> list[dict]:
    """s(k) of lone sessions at every width on a swarm of its own (widths fixed by the client)."""
    from transformers import AutoTokenizer

    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client
    from petals_chain.loopback.speculative_load import measure_speedup

    with tempfile.TemporaryDirectory(prefix="moldable-calib-") as logs, _swarm(Path(logs)) as sw:
        sw.start(timeout_s=600)
        model = AutoDistributedModelForCausalLM.from_pretrained(str(MODEL), orchestrator=sw.url,
                                                               lease_timeout_s=600.0)
        try:
            return measure_speedup(model, AutoTokenizer.from_pretrained(str(MODEL)), WIDTHS, new_tokens, RTT_S,
                                   prompts=_prompts(n_prompts))
        finally:
            close_client(model)


def _live(args, profile: Path, t1: float, new_tokens: int, loads: tuple[float, ...],
          window_s: float, prompts: tuple[str, ...]) -> tuple[list[dict], str]:
    """Every (load, policy) cell on a swarm whose orchestrator chooses the widths (--width, --speedup-profile): the
    client leases with k_max = the widest width and decodes with model.generate(); the policy is switched between
    cells (POST /width, the cell's arrival rate as the prior). The rows and the chain served."""
    from transformers import AutoTokenizer

    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client
    from petals_chain.loopback.speculative_load import serve_load
    from petals_chain.protocol.blocking import request_json

    seq = np.random.SeedSequence(args.seed)
    extra = ("--width", "greedy-p", "--speedup-profile", str(profile), "--width-seed", str(args.seed))
    with tempfile.TemporaryDirectory(prefix="moldable-live-") as logs, _swarm(Path(logs), extra) as sw:
        sw.start(timeout_s=600)
        spans = sw.get("/chains")["chains"][0]["spans"]
        units = sw.get("/width")["units"]
        model = AutoDistributedModelForCausalLM.from_pretrained(str(MODEL), orchestrator=sw.url,
                                                               lease_timeout_s=600.0, speculative_k_max=max(WIDTHS),
                                                               emulated_rtt_s=RTT_S)
        tok = AutoTokenizer.from_pretrained(str(MODEL))
        try:
            sessions = []
            cells = []
            for load, per_load in zip(loads, seq.spawn(len(loads))):
                cells += [(load, policy, per_load) for policy in POLICIES]  # the same arrivals for every policy
            for load, policy, arrivals in tqdm(cells, desc="load × policy cells"):
                rate = load * units / t1
                request_json(sw.url + "/width", data={"policy": policy, "arrival_rate": rate},
                          token=sw.api_token or sw.token)
                rows = serve_load(model, tok, policy, load, rate, window_s, new_tokens,
                                  np.random.default_rng(arrivals), prompts)
                measured = sw.get("/width")
                sessions += [{**r.row(), "measured_load": measured["load"]} for r in rows]
        finally:
            close_client(model)
    return sessions, " → ".join(f"{h['server']}[{h['start']}:{h['end']}]" for h in spans)


REUSED_LINE = ("s(k): the profile an earlier run of this experiment measured on this machine (a --quick run "
               "reuses it; the orchestrator loads the same file with --speedup-profile)")


def _saved_reuse(path: Path) -> bool:
    """Whether the saved run reused an earlier s(k) profile (its summary says so)."""
    return path.is_file() and REUSED_LINE in json.loads(path.read_text()).get("lines", [])


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


def saved_plot_data(out: Path) -> tuple[list[dict], SpeedUp, list[dict]]:
    """From the saved CSVs: the calibration rows, the fitted s(k) and the per-load, per-policy summary rows."""
    calib = read_csv(out / f"{NAME}_speedup.csv")
    speedup = fit(calib)
    return calib, speedup, _summarise(read_csv(out / f"{NAME}_sessions.csv"), speedup)


def _report(args, calib: list[dict], sessions: list[dict], chain: str, settings: tuple[int, float, int],
            reused: bool = False) -> Summary:
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
    lines = _lines(calib, speedup, rows, chain, *settings)
    if reused:
        lines.insert(1, REUSED_LINE)
    return Summary(NAME, "speculative width by greedy(p*) on a live swarm",
                   f"python -m petals_chain.experiments moldable-live{' --quick' if args.quick else ''} "
                   f"--seed {args.seed}", lines,
                   data={"speedup": list(speedup.s), "chain": chain, "rows": rows, "calibration": calib})


def _summarise(sessions: list[dict], speedup) -> list[dict]:
    """Per load and policy: sessions, mean response (95 % CI), wait, service, tokens per second, the widths the
    orchestrator chose (mean and counts) and the load it measured at the end of the cell."""
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
                         "law_mean_width": float(np.dot(np.arange(1, p.size + 1), p)),
                         "widths": " ".join(f"{k}:{n}" for k, n in sorted(Counter(int(s["width"]) for s in mine)
                                                                          .items())),
                         "measured_load": float(mine[-1].get("measured_load", float("nan")))})
    return rows


def _lines(calib: list[dict], speedup, rows: list[dict], hops: str, new_tokens: int, window_s: float,
           n_prompts: int) -> list[str]:
    """Headlines: s(k) measured and fitted, then per load each policy and which one wins, said plainly."""
    base = calib[0]["tokens_per_s"]
    out = [f"SmolLM2-135M, chain {hops}, emulated RTT {RTT_S * 1e3:.0f} ms per hop per step, {new_tokens} new "
           f"tokens per session, {n_prompts} prompts, prompt-lookup drafts; the orchestrator chooses each "
           f"session's width in its lease reply (--width, POST /width between cells) over {UNITS} width units "
           f"(the chain's slots), headroom ρ̄ = {HEADROOM}; the client decodes with model.generate(); Poisson "
           f"arrivals for {window_s:.0f} s per cell, the same arrivals for every policy",
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
            f"{r['tokens_per_s']:.2f} tok/s, width {r['mean_width']:.2f} (k:count {r.get('widths', '?')}), "
            f"n = {r['sessions']}"
            for p, r in cell.items()))
        if len(cell) == len(POLICIES):
            out.append(f"load {load:.2f}: {verdict(cell)}")
            top = cell["fixed-max"]
            out.append(f"load {load:.2f}: fixed-max (mean width {top['mean_width']:.2f}) waited {top['wait_s']:.1f} s "
                       f"for a lease on average (greedy(p*) {cell['greedy-p']['wait_s']:.1f} s, fixed 1 "
                       f"{cell['fixed-1']['wait_s']:.1f} s); load the orchestrator measured at the end: greedy(p*) "
                       f"{cell['greedy-p'].get('measured_load', float('nan')):.2f}")
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


def live_figure(calib: list[dict], speedup, rows: list[dict]):
    """(a) measured s(k), its concave hull and the tokens per step; (b) mean response time and (c) tokens per second
    per session for each load (a group) and policy (side by side), with 95 % intervals and the sessions counted:
    the loads are a few points, so nothing is drawn between them."""
    from petals_chain.experiments.common import figure

    fig, axes = figure(1, 3, figsize=(15, 5.0))
    axes = axes[0]
    k = [r["width"] for r in calib]
    base = calib[0]["tokens_per_s"]
    axes[0].plot(k, [r["tokens_per_s"] / base for r in calib], "o", label="measured tokens/s over width 1")
    axes[0].plot(range(1, speedup.d + 1), speedup.s, "-", label="its concave hull: s(k) used")
    axes[0].plot(k, [r["tokens_per_step"] for r in calib], "x:", label="tokens per step")
    axes[0].set_xlabel("width k (positions verified per step)")
    axes[0].set_ylabel("relative to width 1 (×)")
    axes[0].set_title("(a) speed-up of the speculative width")
    loads = sorted({r["load"] for r in rows})
    step = 0.8 / len(POLICIES)
    for j, (policy, marker) in enumerate(zip(POLICIES, ("o", "s", "^"))):
        mine = {r["load"]: r for r in rows if r["policy"] == policy}
        xs = [i + (j - (len(POLICIES) - 1) / 2) * step for i, load in enumerate(loads) if load in mine]
        got = [mine[load] for load in loads if load in mine]
        for ax, key, ci in ((axes[1], "response_s", "response_ci_s"), (axes[2], "tokens_per_s", "tokens_per_s_ci")):
            ax.errorbar(xs, [r[key] for r in got], yerr=[0 if np.isnan(r[ci]) else r[ci] for r in got], fmt=marker,
                        ms=7, capsize=4, color=f"C{j}", label=policy)
    counts = {load: sorted({int(r["sessions"]) for r in rows if r["load"] == load}) for load in loads}
    ticks = [f"λ = {load:g}\n(n = {'/'.join(map(str, counts[load]))} sessions)" for load in loads]
    axes[1].set_title("(b) mean response time (wait + service)")
    axes[1].set_ylabel("seconds (mean, 95 % interval)")
    axes[2].set_title("(c) tokens per second per session")
    axes[2].set_ylabel("tokens/s (mean, 95 % interval)")
    for ax in axes[1:]:
        ax.set_xticks(range(len(loads)), ticks)
        ax.set_xlim(-0.6, len(loads) - 0.4)
        ax.set_xlabel("load λ (width-1 work per unit)")
        ax.grid(axis="x", visible=False)
    for ax, ncol in zip(axes, (2, 3, 3)):
        ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol)  # below: not over the data
    return fig


def _plot(calib: list[dict], speedup, rows: list[dict], path: Path) -> None:
    """Draw :func:`live_figure` to ``path``."""
    save_figure(live_figure(calib, speedup, rows), path)
