"""Moldable jobs on a live swarm: the speculative width k of each session chosen by the orchestrator in its lease reply,
by greedy(p*) from the load it measures, against fixed k = 1 and fixed maximum k; SmolLM2-135M over two loopback
servers that batch their sessions' steps, with an emulated round trip per hop (docs/moldable.md,
"Speculative width on the swarm", "Width against batching", "Width through the lease API").

On batching servers a session's speculative positions are rows of the same step as every other session's tokens, so
the speed-up of width k depends on the batch it shares. The calibration therefore measures s(k) with 0, 2 and 5
other sessions decoding beside the measured one (``OTHERS``); the orchestrator loads that profile, and ``greedy-p``
chooses from the s(k) measured at the count nearest to the leases held, while ``greedy-p-lone`` keeps the lone
session's s(k) (the rule before batching). Each replication draws one Poisson arrival sequence per load and serves it
under all four policies (the same arrivals); the comparison is paired by replication (experiments/paired.py). A full
run keeps the calibration and every finished cell in its checkpoint (results/resume/) with the machine's load
average, and resumes from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain import defaults
from petals_chain.experiments.checkpoints import append_record, read_records
from petals_chain.experiments.common import (REPO, Summary, checkpoint_path, figure, mean_ci, read_csv, replotting,
                                             save_figure, write_csv)
from petals_chain.experiments.paired import paired
from petals_chain.model import SpecError
from petals_chain.moldable.live import POLICIES, policy_probabilities, profile_from_rows
from petals_chain.moldable.speedup import SpeedUp

NAME = "moldable_live"
REPLOT = True  # `--replot` redraws moldable_live.png and its README section from the saved CSVs
MODEL = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
RTT_S = 0.25  # emulated round trip, client to each server, per step (a WAN swarm: round trips dominate)
UNITS = 8  # width units of the swarm: a session of width k holds k of them
WIDTHS = (1, 2, 3, 4, 6, 8)  # widths the calibration measures (the concave hull fills the others in)
HEADROOM = defaults.TARGET_LOAD
FULL = {"prompts": 3, "new_tokens": 24, "loads": (0.3, 0.7), "window_s": 60.0, "replications": 3, "others": (0, 2, 5)}
QUICK = {"prompts": 2, "new_tokens": 16, "loads": (0.7,), "window_s": 30.0, "replications": 1, "others": (0, 2)}
BUSY_TOKENS = 48  # new tokens of each background session of the calibration (it starts another when done)


def run(args) -> Summary:
    """Calibrate s(k) beside 0..5 other sessions (unless the checkpoint holds it), start the swarm whose orchestrator
    chooses widths from that profile, then serve every (replication, load, policy) cell not yet in the checkpoint;
    ``--replot`` redraws the PNG and the README section from the saved CSVs."""
    size = QUICK if args.quick else FULL
    if replotting(args):
        saved = json.loads((args.out / f"{NAME}.json").read_text())
        return _report(args, read_csv(args.out / f"{NAME}_speedup.csv"),
                       read_csv(args.out / f"{NAME}_sessions.csv"), saved["data"]["chain"], saved["data"]["size"],
                       saved["data"].get("loadavg", []))
    ckpt = checkpoint_path(NAME, args, __name__)
    done = _load(ckpt)
    calib = done.get("calibration")
    if calib is None:
        calib = {"rows": _calibrate(size), "loadavg": os.getloadavg()}
        append_record(ckpt, {"kind": "calibration", **calib})
    profile = args.out / f"{NAME}_speedup.csv"
    write_csv(profile, calib["rows"])
    cells = [(rep, load, policy) for rep in range(size["replications"]) for load in size["loads"]
             for policy in POLICIES]
    missing = [c for c in cells if c not in done]
    chain = done.get("chain", "?")
    if missing:
        def keep(cell: dict[str, Any]) -> None:
            done[(cell["rep"], cell["load"], cell["policy"])] = cell
            append_record(ckpt, {"kind": "cell", **cell})

        chain = _live(args, profile, calib["rows"], size, missing, keep)
        append_record(ckpt, {"kind": "chain", "chain": chain})
    sessions = [row for c in cells for row in done[c]["rows"]]
    loadavg = [calib["loadavg"][0], *(done[c]["loadavg"][0] for c in cells)]
    return _report(args, calib["rows"], sessions, chain, size, loadavg)


def _load(path: Path | None) -> dict[Any, Any]:
    """The checkpoint's records: 'calibration', 'chain', and each cell by (replication, load, policy)."""
    out: dict[Any, Any] = {}
    for d in read_records(path):
        kind = d.pop("kind")
        if kind == "cell":
            out[(int(d["rep"]), float(d["load"]), d["policy"])] = d
        elif kind == "chain":
            out["chain"] = d["chain"]
        else:
            out[kind] = d
    return out


def _prompts(n: int) -> tuple[str, ...]:
    """The first ``n`` prompts of the load generator."""
    from petals_chain.loopback.speculative_load import PROMPTS

    return PROMPTS[:n]


def _swarm(logs: Path, extra: tuple[str, ...] = ()):
    """The loopback swarm of this experiment: two SmolLM2 servers (batching their sessions' steps, the default),
    one chain of UNITS slots."""
    from petals_chain.loopback.swarm import LocalSwarm, ServerPlan

    if not (MODEL / "model.safetensors").is_file():
        raise SpecError(f"model: {MODEL} is missing; run scripts/prepare_model.sh")
    plans = [ServerPlan("a", "260MB"), ServerPlan("b", "260MB")]
    return LocalSwarm(MODEL, plans, log_dir=logs, model_name="SmolLM2-135M-Instruct", max_length=128,
                      arrival_rate=0.2, c=UNITS, orchestrator_args=extra)


@contextlib.contextmanager
def busy(model, tokenizer, others: int, prompts: tuple[str, ...]) -> Iterator[None]:
    """``others`` sessions decoding greedily at width 1 (the same emulated round trip) until the block ends, each
    starting another when it finishes: the batch a measured session shares its steps with."""
    from petals_chain.loopback.speculative_load import one_session

    stop = threading.Event()
    errors: list[BaseException] = []

    def loop(i: int) -> None:
        while not stop.is_set():
            try:
                one_session(model, tokenizer, prompts[i % len(prompts)], BUSY_TOKENS, 1, RTT_S)
            except BaseException as exc:  # reported when the block ends
                errors.append(exc)
                return

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(others)]
    for th in threads:
        th.start()
    try:
        yield
    finally:
        stop.set()
        for th in threads:
            th.join(600)
    if errors:
        raise RuntimeError(f"{len(errors)} background sessions failed; first: {errors[0]!r}") from errors[0]


def _calibrate(size: dict[str, Any]) -> list[dict]:
    """s(k) of a session at each width with 0, 2, … other sessions decoding beside it, on a swarm of its own
    (widths fixed by the client); one row per (others, width)."""
    from transformers import AutoTokenizer

    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client
    from petals_chain.loopback.speculative_load import measure_speedup

    prompts = _prompts(size["prompts"])
    rows = []
    with tempfile.TemporaryDirectory(prefix="moldable-calib-") as logs, _swarm(Path(logs)) as sw:
        sw.start(timeout_s=600)
        model = AutoDistributedModelForCausalLM.from_pretrained(str(MODEL), orchestrator=sw.url,
                                                               lease_timeout_s=600.0)
        tok = AutoTokenizer.from_pretrained(str(MODEL))
        try:
            for others in size["others"]:
                print(f"[{NAME}] s(k) beside {others} other sessions", flush=True)
                with busy(model, tok, others, prompts):
                    got = measure_speedup(model, tok, WIDTHS, size["new_tokens"], RTT_S, prompts=prompts)
                rows += [{"others": others, **r} for r in got]
        finally:
            close_client(model)
    return rows


def _live(args, profile: Path, calib: list[dict], size: dict[str, Any], cells: list[tuple[int, float, str]],
          keep: Callable[[dict[str, Any]], None]) -> str:
    """Every missing cell on a swarm whose orchestrator chooses the widths (--width, --speedup-profile with the
    batch profile): the client leases with k_max = the widest width and decodes with model.generate(); the policy
    is switched between cells (POST /width, the cell's arrival rate as the prior). Replication r's arrivals at a
    load are the same for every policy. Returns the chain served."""
    from transformers import AutoTokenizer

    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client
    from petals_chain.loopback.speculative_load import serve_load
    from petals_chain.protocol.blocking import request_json

    t1 = next(r["service_s"] for r in calib if int(r["others"]) == min(size["others"]) and int(r["width"]) == 1)
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
            for rep, load, policy in cells:
                rate = load * units / t1
                request_json(sw.url + "/width", data={"policy": policy, "arrival_rate": rate},
                             token=sw.api_token or sw.token)
                print(f"[{NAME}] replication {rep}, load {load}: {policy} at {rate:.3f} arrivals/s", flush=True)
                before = os.getloadavg()
                arrivals = np.random.default_rng([args.seed, rep, int(round(load * 1000))])
                rows = serve_load(model, tok, policy, load, rate, size["window_s"], size["new_tokens"], arrivals,
                                  _prompts(size["prompts"]))
                measured = sw.get("/width")
                keep({"rep": rep, "load": load, "policy": policy, "loadavg": before,
                      "rows": [{**r.row(), "rep": rep, "measured_load": measured["load"]} for r in rows]})
        finally:
            close_client(model)
    return " → ".join(f"{h['server']}[{h['start']}:{h['end']}]" for h in spans)


def profiles(calib: list[dict]) -> dict[int, SpeedUp]:
    """Per count of others, the concave hull of the measured tokens per second, normalised to width 1 (a profile
    without an ``others`` column was measured alone: count 0); the orchestrator's reader of the same rows."""
    return dict(profile_from_rows(calib, f"{NAME} calibration").by_others)


def saved_plot_data(out: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """From the saved CSVs: the calibration rows, the per-load, per-policy summary rows and the sessions."""
    calib = read_csv(out / f"{NAME}_speedup.csv")
    sessions = read_csv(out / f"{NAME}_sessions.csv")
    fits = profiles(calib)
    return calib, _summarise(sessions, fits[min(fits)]), sessions


def _report(args, calib: list[dict], sessions: list[dict], chain: str, size: dict[str, Any],
            loadavg: list[float]) -> Summary:
    """Fit, summarise, write the CSVs (not when replotting) and the PNG; the Summary for results/README.md."""
    fits = profiles(calib)
    lone = fits[min(fits)]
    for row in calib:
        s = fits[int(row.get("others") or 0)]
        w = int(row["width"])
        row["fitted_speedup"] = s.s[w - 1] if w <= s.d else float("nan")
    rows = _summarise(sessions, lone)
    if not replotting(args):
        write_csv(args.out / f"{NAME}_speedup.csv", calib)
        write_csv(args.out / f"{NAME}_sessions.csv", sessions)
    write_csv(args.out / f"{NAME}.csv", rows)
    save_figure(live_figure(calib, rows, sessions), args.out / f"{NAME}.png")
    lines = _lines(calib, fits, rows, sessions, chain, size, loadavg)
    return Summary(NAME, "speculative width by greedy(p*) on a live swarm of batching servers",
                   f"python -m petals_chain.experiments moldable-live{' --quick' if args.quick else ''} "
                   f"--seed {args.seed}", lines,
                   data={"speedup_by_others": {str(b): list(s.s) for b, s in fits.items()}, "chain": chain,
                         "rows": rows, "calibration": calib, "size": size, "loadavg": loadavg,
                         "paired": _paired(sessions)})


def _summarise(sessions: list[dict], speedup: SpeedUp) -> list[dict]:
    """Per load and policy over every replication: sessions, mean response (95 % CI over sessions), wait, service,
    tokens per second, the widths the orchestrator chose (mean and counts), the mean width of greedy(p*)'s law at
    that load with the lone s(k), and the load it measured at the end of the cells."""
    rows = []
    for load in sorted({float(s["load"]) for s in sessions}):
        for policy in POLICIES:
            mine = [s for s in sessions if float(s["load"]) == load and s["policy"] == policy]
            if not mine:
                continue
            resp, resp_ci = mean_ci(float(s["response_s"]) for s in mine)
            tps, tps_ci = mean_ci(float(s["tokens_per_s"]) for s in mine)
            p = policy_probabilities(policy, speedup, load, HEADROOM)
            rows.append({"load": load, "policy": policy, "sessions": len(mine), "response_s": resp,
                         "response_ci_s": resp_ci, "wait_s": float(np.mean([float(s["wait_s"]) for s in mine])),
                         "service_s": float(np.mean([float(s["service_s"]) for s in mine])), "tokens_per_s": tps,
                         "tokens_per_s_ci": tps_ci, "mean_width": float(np.mean([int(s["width"]) for s in mine])),
                         "law_mean_width": float(np.dot(np.arange(1, p.size + 1), p)),
                         "widths": " ".join(f"{k}:{n}" for k, n in sorted(Counter(int(s["width"]) for s in mine)
                                                                          .items())),
                         "measured_load": float(np.mean([float(s.get("measured_load", "nan")) for s in mine]))})
    return rows


def _rep_means(sessions: list[dict]) -> dict[tuple[float, str], dict[int, float]]:
    """Mean response per (load, policy) and replication (a run without replications is replication 0)."""
    out: dict[tuple[float, str], dict[int, list[float]]] = {}
    for s in sessions:
        key = (float(s["load"]), s["policy"])
        out.setdefault(key, {}).setdefault(int(s.get("rep") or 0), []).append(float(s["response_s"]))
    return {k: {r: float(np.mean(v)) for r, v in reps.items()} for k, reps in out.items()}


def _paired(sessions: list[dict]) -> dict[str, dict[str, Any]]:
    """Per load, greedy(p*) minus each other policy, paired by replication (the same arrivals): 'LOAD/POLICY' →
    the paired summary's fields."""
    means = _rep_means(sessions)
    out = {}
    for load in sorted({k[0] for k in means}):
        g = means.get((load, "greedy-p"), {})
        for policy in POLICIES[1:]:
            other = means.get((load, policy), {})
            reps = sorted(set(g) & set(other))
            if reps:
                p = paired([g[r] - other[r] for r in reps])
                out[f"{load}/{policy}"] = {"mean": p.mean, "half_width": p.half_width, "n": p.n,
                                           "detectable": p.detectable, "text": p.text(" s", 2)}
    return out


def _lines(calib: list[dict], fits: dict[int, SpeedUp], rows: list[dict], sessions: list[dict], hops: str,
           size: dict[str, Any], loadavg: list[float]) -> list[str]:
    """Headlines: s(k) measured and fitted per batch, then per load each policy, and greedy(p*) against each other
    policy paired by replication."""
    reps = len({int(s.get("rep") or 0) for s in sessions})
    out = [f"SmolLM2-135M on two batching servers, chain {hops}, emulated RTT {RTT_S * 1e3:.0f} ms per hop per step, "
           f"{size['new_tokens']} new tokens per session, {size['prompts']} prompts, prompt-lookup drafts; the "
           f"orchestrator chooses each session's width in its lease reply (--width, POST /width between cells) over "
           f"{UNITS} width units (the chain's slots), headroom ρ̄ = {HEADROOM}; {reps} replication"
           f"{'s' if reps > 1 else ''}, each one Poisson arrival sequence per load ({size['window_s']:.0f} s) served "
           "under every policy"]
    for b, s in fits.items():
        mine = [r for r in calib if int(r.get("others") or 0) == b]
        base = next(float(r["tokens_per_s"]) for r in mine if int(r["width"]) == 1)
        out.append(f"beside {b} other session{'s' if b != 1 else ''}: measured tokens/s over width 1 at k = "
                   + ", ".join(f"{int(r['width'])}: {float(r['tokens_per_s']) / base:.2f}" for r in mine)
                   + f" (width 1: {base:.2f} tokens/s, {float(mine[0]['tokens_per_step']):.2f} tokens/step); "
                   "fitted concave s: " + ", ".join(f"{v:.2f}" for v in s.s)
                   + (f" (cut at k = {s.d}: wider never helped)" if s.d < max(int(r["width"]) for r in mine)
                      else ""))
    for load in sorted({r["load"] for r in rows}):
        cell = {r["policy"]: r for r in rows if r["load"] == load}
        out.append(f"load {load:.2f}: " + "; ".join(
            f"{p} {r['response_s']:.2f} s (wait {r['wait_s']:.2f} s), width {r['mean_width']:.2f} "
            f"(k:count {r['widths']}), n = {r['sessions']}" for p, r in cell.items()))
    for key, p in _paired(sessions).items():
        load, policy = key.split("/")
        out.append(f"load {float(load):.2f}: greedy-p minus {policy}, mean response paired by replication: "
                   f"{p['text']}")
    if loadavg:
        out.append(f"machine load average (1 min) at the calibration's and the cells' starts {min(loadavg):.2f}–"
                   f"{max(loadavg):.2f}")
    return out


def live_figure(calib: list[dict], rows: list[dict], sessions: list[dict]):
    """(a) measured s(k) and its concave hull for each count of other sessions in the batch; (b) mean response time
    per load (a group) and policy (side by side), 95 % intervals over sessions; (c) greedy(p*) minus each other
    policy per replication (dots) with the paired mean and its 95 % interval where there are two replications."""
    fig, axes = figure(1, 3, figsize=(15, 5.0))
    axes = axes[0]
    fits = profiles(calib)
    for j, (b, s) in enumerate(fits.items()):
        mine = [r for r in calib if int(r.get("others") or 0) == b]
        base = next(float(r["tokens_per_s"]) for r in mine if int(r["width"]) == 1)
        axes[0].plot([int(r["width"]) for r in mine], [float(r["tokens_per_s"]) / base for r in mine], "o",
                     color=f"C{j}", label=f"measured, {b} others")
        axes[0].plot(range(1, s.d + 1), s.s, "-", color=f"C{j}", label=f"concave hull, {b} others")
    axes[0].set_xlabel("width k (positions verified per step)")
    axes[0].set_ylabel("tokens/s over width 1 (×)")
    axes[0].set_title("(a) s(k) beside other sessions")
    loads = sorted({r["load"] for r in rows})
    step = 0.8 / len(POLICIES)
    for j, (policy, marker) in enumerate(zip(POLICIES, ("o", "D", "s", "^"))):
        mine = {r["load"]: r for r in rows if r["policy"] == policy}
        xs = [i + (j - (len(POLICIES) - 1) / 2) * step for i, load in enumerate(loads) if load in mine]
        got = [mine[load] for load in loads if load in mine]
        axes[1].errorbar(xs, [r["response_s"] for r in got],
                         yerr=[0 if np.isnan(r["response_ci_s"]) else r["response_ci_s"] for r in got], fmt=marker,
                         ms=7, capsize=4, color=f"C{j}", label=policy)
    means = _rep_means(sessions)
    others = POLICIES[1:]
    step = 0.8 / len(others)
    for i, load in enumerate(loads):
        g = means.get((load, "greedy-p"), {})
        for j, policy in enumerate(others):
            o = means.get((load, policy), {})
            d = [g[r] - o[r] for r in sorted(set(g) & set(o))]
            x = i + (j - (len(others) - 1) / 2) * step
            color = f"C{POLICIES.index(policy)}"
            axes[2].plot([x] * len(d), d, ".", color=color, alpha=0.6,
                         label=f"minus {policy}" if i == 0 else None)
            if len(d) >= 2:
                p = paired(d)
                axes[2].errorbar(x + 0.08, p.mean, yerr=p.half_width, fmt="o", color=color, capsize=4)
    axes[2].axhline(0.0, color="0.4", lw=0.8)
    axes[1].set_title("(b) mean response time (wait + service)")
    axes[1].set_ylabel("seconds (mean, 95 % interval)")
    axes[2].set_title("(c) greedy-p minus another policy")
    axes[2].set_ylabel("difference of mean response (s)")
    counts = {load: sorted({int(r["sessions"]) for r in rows if r["load"] == load}) for load in loads}
    ticks = [f"λ = {load:g}\n(n = {'/'.join(map(str, counts[load]))} sessions)" for load in loads]
    for ax in axes[1:]:
        ax.set_xticks(range(len(loads)), ticks)
        ax.set_xlim(-0.6, len(loads) - 0.4)
        ax.set_xlabel("load λ (width-1 work per unit)")
        ax.grid(axis="x", visible=False)
    for ax, ncol in zip(axes, (2, 2, 2)):
        ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=ncol)  # below: not over the data
    return fig
