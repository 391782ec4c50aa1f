"""Fit τp = t_o + m·(t_in·l_in + t_out·(l_out − 1)) to measure_tau.py's timings, compare with the datasheet formula,
check memory_sizing.py's numbers against s_m·k + s_c·slots, and write the device kind, the plots and a summary.

Inputs (in --dir): tau_raw.json, memory_raw.json (optional), tau_graphs_raw.json (optional: measure_tau.py
--grid graphs, eager vs CUDA-graph timings of 32 blocks, which separate the launch overhead from the GPU's time).
Outputs (in --dir): fit.json (every fitted and derived number), device_<gpu>.json (a cluster file whose
``devices:`` section holds the GPU's datasheet and measured kinds, accepted by petals_chain.compose.cluster_file),
fig9_gpu.png (computation time vs blocks, input length, output length, like the paper's Fig. 9),
tau_concurrency.png (decode step vs context and prefill vs tokens for 1…c sessions) and memory_sizing.png.

The formula side: t_in = F/f with F = 2·(weights of one block) FLOPs per token (attention excluded, as in
the paper) and f the datasheet dense bf16 FLOP/s; t_out = s_m/b with s_m the block's bytes and b the datasheet
memory bandwidth. numpy + matplotlib only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

# Datasheet dense (no sparsity) bf16 FLOP/s and memory bandwidth (NVIDIA product pages / datasheets).
DATASHEETS = [  # (marker in the CUDA/nvidia-smi name, label, TFLOP/s, GB/s)
    ("H100 NVL", "H100 NVL", 835.0, 3900.0),
    ("H100 PCIe", "H100 PCIe", 756.0, 2000.0),
    ("H100", "H100 SXM5 80GB HBM3", 989.4, 3350.0),
    ("H200", "H200 SXM 141GB HBM3e", 989.4, 4800.0),
    ("A100", "A100 SXM4 80GB", 312.0, 2039.0),
]
REPO_STEP_OVERHEAD_S = 0.001  # t_o in petals_chain/service_time.py
# The repo's LLaMA-2-7B figures (petals_chain.model_shapes.paper_testbed_sizes, repeated here so that this script
# needs numpy and matplotlib only): an fp16 block, and K and V of 4096 values for 2048 cached tokens.
LLAMA_BLOCK_GB = 2 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) / 1e9
LLAMA_CACHE_GB = 2 * 4096 * 2048 * 2 / 1e9


def datasheet(name: str) -> tuple[str, float, float] | None:
    """(label, FLOP/s, bytes/s) for a GPU name, None if unknown."""
    for marker, label, tf, bw in DATASHEETS:
        if marker in name:
            return label, tf * 1e12, bw * 1e9
    return None


def lstsq(X: np.ndarray, y: np.ndarray, rel: bool = True) -> tuple[np.ndarray, dict]:
    """Least squares (relative: rows weighted by 1/y); coefficients and goodness of fit on y."""
    w = 1.0 / y if rel else np.ones_like(y)
    coef, *_ = np.linalg.lstsq(X * w[:, None], y * w, rcond=None)
    pred = X @ coef
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    relerr = np.abs(pred - y) / y
    return coef, {"r2": 1 - ss_res / ss_tot, "r2_log": _r2(np.log(y), np.log(np.maximum(pred, 1e-12))),
                  "median_rel_err": float(np.median(relerr)), "max_rel_err": float(relerr.max()), "n": int(len(y))}


def _r2(y: np.ndarray, p: np.ndarray) -> float:
    return float(1 - np.sum((y - p) ** 2) / np.sum((y - y.mean()) ** 2))


def samples(raw: dict, c: int, louts: list[int]) -> list[tuple[int, int, int, float, str]]:
    """(m, l_in, l_out, seconds, kind) for sessions c: prefill-only jobs and prefill + l_out − 1 decode steps."""
    pre = {(r["m"], r["l_in"]): r["median_s"] for r in raw["prefill"] if r["c"] == c}
    out = [(m, lin, 1, t, "prefill") for (m, lin), t in pre.items()]
    for r in raw["decode"]:
        if r["c"] != c or (r["m"], r["l_in"]) not in pre:
            continue
        cum = np.concatenate([[0.0], np.cumsum(r["steps_s"])])
        for lo in louts:
            if lo - 1 < len(cum) and lo > 1:
                out.append((r["m"], r["l_in"], lo, pre[(r["m"], r["l_in"])] + float(cum[lo - 1]), "decode"))
    return out


def fit_tau(rows: list[tuple]) -> dict:
    """Fit the brief's model (t_o once per job) and the repo's (t_o per block); both with their goodness of fit."""
    m = np.array([r[0] for r in rows], float)
    lin = np.array([r[1] for r in rows], float)
    lo = np.array([r[2] for r in rows], float)
    y = np.array([r[3] for r in rows], float)
    out = {}
    for key, X in (("per_job_t_o", np.stack([np.ones_like(m), m * lin, m * (lo - 1)], 1)),
                   ("per_block_t_o", np.stack([m, m * lin, m * (lo - 1)], 1))):
        coef, gof = lstsq(X, y)
        out[key] = {"t_o_s": float(coef[0]), "t_in_s": float(coef[1]), "t_out_s": float(coef[2]), **gof}
    return out


def direct_estimates(raw: dict, c: int) -> dict:
    """Slopes read straight off the data: prefill s/(block·token) per l_in, decode s/(block·step) vs context."""
    pre = [r for r in raw["prefill"] if r["c"] == c]
    ms = sorted({r["m"] for r in pre})
    per_lin = {}
    for lin in sorted({r["l_in"] for r in pre}):
        pts = sorted((r["m"], r["median_s"]) for r in pre if r["l_in"] == lin)
        if len(pts) >= 2:
            a = np.polyfit([p[0] for p in pts], [p[1] for p in pts], 1)
            per_lin[lin] = {"per_block_s": float(a[0]), "per_block_token_s": float(a[0] / lin / c),
                            "intercept_s": float(a[1])}
    dec = {}
    for r in raw["decode"]:
        if r["c"] == c:
            st = np.array(r["steps_s"])
            ctx = r["l_in"] + np.arange(len(st))
            a = np.polyfit(ctx, st, 1)
            dec[r["m"]] = {"median_step_s": float(np.median(st)), "per_block_step_s": float(np.median(st) / r["m"]),
                           "slope_per_context_token_s": float(a[0]), "step_at_context0_s": float(a[1]),
                           "context_range": [int(ctx[0]), int(ctx[-1])]}
    slope_m = None
    if len(dec) >= 2:
        mm = sorted(dec)
        slope_m = float(np.polyfit(mm, [dec[k]["median_step_s"] for k in mm], 1)[0])
    return {"ms": ms, "prefill_by_l_in": per_lin, "decode_by_m": dec, "decode_step_per_block_slope_s": slope_m}


def graph_analysis(g: dict, raw: dict, sheet: tuple | None) -> dict:
    """Per-block decode step = a + β·c·context and prefill = a + t_in·l_in, eager and replayed from CUDA graphs."""
    F, s_m, kv = raw["shape"]["matmul_flops_per_token"], raw["block_bytes"], raw["cache_bytes_per_block_session_token"]
    out = {"ceilings": g.get("ceilings")}
    dec = [e for e in g["graph"] if e.get("tokens", 1) == 1 and "graph_median_s" in e]
    pre = [e for e in g["graph"] if e.get("tokens", 1) > 1 and e["c"] == 1 and "graph_median_s" in e]
    for how in ("graph", "eager"):
        res = {}
        if dec:
            X = np.array([[1.0, e["c"] * e["context"]] for e in dec])
            y = np.array([e[f"{how}_median_s"] / e["m"] for e in dec])
            coef, gof = lstsq(X, y)
            res["decode"] = {"t_out_s": float(coef[0]), "kv_s_per_session_token": float(coef[1]),
                             "weights_gb_per_s": s_m / coef[0] / 1e9, "kv_gb_per_s": kv / coef[1] / 1e9
                             if coef[1] > 0 else None, **gof}
            if sheet:
                res["decode"]["t_out_over_formula"] = float(coef[0]) / (s_m / sheet[2])
        big = [e for e in pre if e["tokens"] >= 1024]
        if len(big) >= 2:
            a = np.polyfit([e["tokens"] for e in big], [e[f"{how}_median_s"] / e["m"] for e in big], 1)
            res["prefill"] = {"t_in_s": float(a[0]), "intercept_s": float(a[1]), "tflops": F / a[0] / 1e12,
                              "from_l_in": [e["tokens"] for e in big]}
            if sheet:
                res["prefill"]["t_in_over_formula"] = float(a[0]) / (F / sheet[1])
            small = min(pre, key=lambda e: e["tokens"])
            res["prefill"]["per_block_at_shortest_s"] = small[f"{how}_median_s"] / small["m"]
            res["prefill"]["shortest_l_in"] = small["tokens"]
        out[how] = res
    return out


def memory_analysis(mem: dict) -> dict:
    """Predicted s_m·k + s_c·k·c vs measured; overhead terms fitted from the peaks."""
    rows = mem["rows"]
    out = {"s_m_bytes": mem["s_m_bytes"], "s_c_bytes": mem["s_c_bytes"],
           "tokens_per_session": mem["tokens_per_session"],
           "context_bytes": mem.get("device_used_after_context_bytes"),
           "cublas_workspace_bytes": mem.get("cublas_workspace_bytes", 0), "rows": []}
    acts, xs = [], []
    for r in rows:
        pred = r["predicted_bytes"]
        row = {"k": r["k"], "c": r["c"], "predicted_gib": pred / 2**30}
        if "static_allocated" in r:
            row["static_gib"] = r["static_allocated"] / 2**30
            row["static_vs_predicted"] = (r["static_allocated"] - pred) / pred
            row["repo_s_m_vs_static"] = (r["predicted_repo_s_m_bytes"] - r["static_allocated"]) / r["static_allocated"]
            for key in r:
                if key.startswith("peak_prefill_"):
                    lin = int(key.rsplit("_", 1)[1])
                    extra = r[key] - r["static_allocated"]
                    row[f"prefill_{lin}_extra_gib"] = extra / 2**30
                    acts.append(extra)
                    xs.append(r["c"] * lin)
                if key.startswith("peak_decode_"):
                    row[key.replace("peak_", "") + "_extra_gib"] = (r[key] - r["static_allocated"]) / 2**30
            row["device_used_gib"] = r["device_used_after"] / 2**30
            row["device_minus_reserved_gib"] = (r["device_used_after"] - r["reserved_peak"]) / 2**30
            row["device_vs_predicted"] = (r["device_used_after"] - pred) / pred
        out["rows"].append(row)
    if acts:
        a = np.polyfit(np.array(xs, float), np.array(acts, float), 1)
        out["activation_fit"] = {"bytes_per_session_token": float(a[0]), "constant_bytes": float(a[1]),
                                 "max_extra_gib": max(acts) / 2**30}
        statics = [r["static_vs_predicted"] for r in out["rows"] if "static_vs_predicted" in r]
        out["static_max_abs_rel_diff"] = float(max(abs(s) for s in statics))
        dev = [r["device_minus_reserved_gib"] for r in out["rows"] if "device_minus_reserved_gib" in r]
        out["outside_allocator_gib"] = [float(min(dev)), float(max(dev))]
        out["fixed_overhead_bytes"] = max(dev) * 2**30 + out["cublas_workspace_bytes"]
    return out


def write_device(path: Path, raw: dict, fit: dict, mem: dict | None, sheet: tuple | None, key: str) -> dict:
    """A cluster file (only keys the strict cluster format accepts) with the GPU as device kinds, and beside it
    ``<name>_fit.json`` with the raw fitted t_o, t_in, t_out and how each device figure was derived."""
    F = raw["shape"]["matmul_flops_per_token"]
    s_m = raw["block_bytes"]
    f = fit["c1"]["fit"]["per_job_t_o"]
    fb = fit["c1"]["fit"]["per_block_t_o"]
    total = raw["gpu"].get("total_memory_bytes", 0)
    usable, memory_note = total, "the GPU's total memory"
    if mem and "activation_fit" in mem:
        fixed = mem["fixed_overhead_bytes"]
        act = mem["activation_fit"]["bytes_per_session_token"] * 2048 + mem["activation_fit"]["constant_bytes"]
        usable = total - fixed - act
        memory_note = ("total minus what lies outside PyTorch's allocator (CUDA context, library handles), the cuBLAS "
                       "workspace and the activation peak of one 2048-token prefill of one session "
                       "(memory_sizing.py)")
    wl = {"input_tokens": 2048, "output_tokens": 28, "gflops_per_block_token": round(F / 1e9, 4)}
    devices: dict[str, dict] = {}
    notes: dict[str, str] = {}
    if sheet:
        devices[f"{key}-datasheet"] = {"memory_gb": round(total / 1e9, 3), "tflops": sheet[1] / 1e12,
                                       "bandwidth_gb_per_s": sheet[2] / 1e9}
        notes[f"{key}-datasheet"] = f"datasheet of the {sheet[0]} (dense bf16); memory: the GPU's total memory"
    devices[f"{key}-measured"] = {"memory_gb": round(usable / 1e9, 3), "tflops": round(F / f["t_in_s"] / 1e12, 2),
                                  "bandwidth_gb_per_s": round(s_m / f["t_out_s"] / 1e9, 1)}
    notes[f"{key}-measured"] = (f"tflops = F/t_in and bandwidth = s_m/t_out of the fit t_o + m(t_in l_in + "
                                f"t_out(l_out-1)) to eager PyTorch timings (1 session, {raw['dtype']}); memory: "
                                f"{memory_note}")
    gr = (fit.get("graphs") or {}).get("graph", {})
    if "decode" in gr and "prefill" in gr:
        devices[f"{key}-graph"] = {"memory_gb": round(usable / 1e9, 3), "tflops": round(gr["prefill"]["tflops"], 2),
                                   "bandwidth_gb_per_s": round(gr["decode"]["weights_gb_per_s"], 1)}
        notes[f"{key}-graph"] = ("the same blocks replayed from CUDA graphs (no launch overhead): tflops = F/t_in "
                                 "of prefills of 1024-4096 tokens, bandwidth = s_m/t_out of the decode step at "
                                 "context 0 (KV reads excluded)")
    servers = [{"name": k.removeprefix(f"{key}-"), "device": k, "rtt_ms": 0} for k in devices]
    tau_fit = fb["t_o_s"] + fb["t_in_s"] * wl["input_tokens"] + fb["t_out_s"] * (wl["output_tokens"] - 1)
    servers.append({"name": "fit", "device": f"{key}-measured", "tau_p_s": round(tau_fit, 6), "rtt_ms": 0})
    notes["server fit"] = ("tau_p_s: the per-block fit m(t_o + t_in l_in + t_out(l_out-1)) at the file's workload, "
                           "in place of the formula's fixed t_o = 1 ms")
    doc = {"model": {"name": "llama-2-7b", "blocks": 32, "block_gb": LLAMA_BLOCK_GB, "cache_gb": LLAMA_CACHE_GB},
           "load": {"arrival_rate": 1.0, "target_load": 0.7}, "workload": wl, "devices": devices,
           "servers": servers}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    side = {"about": f"Fitted on {raw['gpu'].get('name')} by experiments/gpu/fit_and_plot.py; the cluster file "
                     f"{path.name} holds the device kinds built from these numbers.",
            "device_notes": notes, "gpu": raw["gpu"], "dtype": raw["dtype"], "sdpa": raw.get("sdpa"),
            "F_flops_per_block_token": F, "s_m_bytes": s_m, "usable_memory_bytes": usable,
            "fit_one_session": fit["c1"]["fit"], "formula_datasheet": fit.get("formula"),
            "formula_measured_ceilings": fit.get("formula_measured_ceilings"), "ceilings": raw.get("ceilings"),
            "graphs": fit.get("graphs")}
    path.with_name(path.stem + "_fit.json").write_text(json.dumps(side, indent=1) + "\n")
    return doc


def _pyplot():
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fig9_figure(raw: dict, fit: dict, sheet: tuple | None):
    """fig9_gpu.png: computation time vs blocks, input length and output length, points measured, the fit solid,
    the datasheet formula dotted; each panel's legend below it, clear of the points."""
    plt = _pyplot()
    f = fit["c1"]["fit"]["per_job_t_o"]
    form = fit.get("formula")

    def model(m, lin, lo, p):
        return p["t_o_s"] + m * (p["t_in_s"] * lin + p["t_out_s"] * (lo - 1))

    pre = {(r["m"], r["l_in"]): r["median_s"] for r in raw["prefill"] if r["c"] == 1}
    dec = {r["m"]: r for r in raw["decode"] if r["c"] == 1}
    ms_all = sorted({m for m, _ in pre})
    lins = sorted({lin for _, lin in pre})
    fig, ax = plt.subplots(1, 3, figsize=(16, 5.6), layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # (a) vs number of blocks
    lin0 = min(dec.values(), key=lambda r: r["m"])["l_in"] if dec else lins[0]
    cases = [(lin, 1) for lin in (lins[0], lins[len(lins) // 2], lins[-1])]
    if dec:
        longest = max(len(r["steps_s"]) for r in dec.values()) + 1
        cases += [(lin0, lo) for lo in (min(128, longest), longest)]
    for k, (lin, lo) in enumerate(dict.fromkeys(cases)):
        pts = []
        for m in ms_all:
            if lo == 1 and (m, lin) in pre:
                pts.append((m, pre[(m, lin)]))
            elif lo > 1 and m in dec and (m, lin) in pre and len(dec[m]["steps_s"]) >= lo - 1:
                pts.append((m, pre[(m, lin)] + float(np.sum(dec[m]["steps_s"][:lo - 1]))))
        if not pts:
            continue
        x = np.array([p[0] for p in pts])
        ax[0].plot(x, [p[1] for p in pts], "o", color=colors[k % 10], label=f"l_in={lin}, l_out={lo}")
        xx = np.linspace(1, max(ms_all), 50)
        ax[0].plot(xx, model(xx, lin, lo, f), "-", color=colors[k % 10], lw=1)
        if form:
            ax[0].plot(xx, model(xx, lin, lo, form), ":", color=colors[k % 10], lw=1.2)
    ax[0].set(xlabel="number of blocks m", ylabel="computation time (s)", yscale="log",
              title="(a) vs number of blocks (1 session)")
    # (b) vs input length
    for k, m in enumerate(m for m in (1, 8, 32) if m in ms_all):
        xs = [lin for lin in lins if (m, lin) in pre]
        ax[1].plot(xs, [pre[(m, lin)] for lin in xs], "o", color=colors[k], label=f"m={m}")
        xx = np.geomspace(min(lins), max(lins), 50)
        ax[1].plot(xx, model(m, xx, 1, f), "-", color=colors[k], lw=1)
        if form:
            ax[1].plot(xx, model(m, xx, 1, form), ":", color=colors[k], lw=1.2)
    ax[1].set(xlabel="input length l_in (tokens), l_out = 1", ylabel="prefill time (s)", xscale="log", yscale="log",
              title="(b) vs input length (1 session)")
    ax[1].set_xticks(lins, [str(x) for x in lins])
    ax[1].minorticks_off()
    # (c) vs output length
    for k, m in enumerate(m for m in (1, 8, 32) if m in dec):
        r = dec[m]
        lo = np.arange(1, len(r["steps_s"]) + 2)
        y = pre.get((m, r["l_in"]), 0.0) + np.concatenate([[0.0], np.cumsum(r["steps_s"])])
        sel = np.unique(np.geomspace(1, len(lo), 40).astype(int)) - 1
        ax[2].plot(lo[sel], y[sel], "o", ms=4, color=colors[k], label=f"m={m}, l_in={r['l_in']}")
        ax[2].plot(lo, model(m, r["l_in"], lo, f), "-", color=colors[k], lw=1)
        if form:
            ax[2].plot(lo, model(m, r["l_in"], lo, form), ":", color=colors[k], lw=1.2)
    ax[2].set(xlabel="output length l_out (tokens)", ylabel="computation time (s)", xscale="log", yscale="log",
              title="(c) vs output length (1 session)")
    for a in ax:
        a.grid(True, which="both", alpha=0.3)
        a.plot([], [], "k-", lw=1, label="fit t_o + m(t_in l_in + t_out(l_out−1))")
        if form:
            a.plot([], [], "k:", lw=1.2, label=f"formula: F/f, s_m/b ({sheet[0] if sheet else 'datasheet'})")
        a.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)  # below: not over the points
    fig.suptitle(f"τp on {raw['gpu'].get('name', raw['gpu']['device_type'])}, LLaMA-2-7B blocks, {raw['dtype']}, "
                 f"eager PyTorch; points measured, lines fitted / datasheet formula")
    return fig


def concurrency_figure(raw: dict, fit: dict, sheet: tuple | None, shown: int = 3, bin_tokens: int = 256):
    """tau_concurrency.png: (a) the decode step per block vs context for ``shown`` session counts c (the fewest,
    one between and the most) as the mean of context windows of about ``bin_tokens`` tokens each (at least 3 per
    series) with the quartiles shaded (single steps jump between two levels ±30 % apart, which drawn raw, or as
    means of short windows, was a tangle); (b) prefill per block vs tokens; (c) eager vs CUDA graph."""
    plt = _pyplot()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    graphs = fit.get("graphs_raw")
    fig, ax = plt.subplots(1, 3 if graphs else 2, figsize=(18 if graphs else 12, 5.6), layout="constrained")
    cs = sorted({r["c"] for r in raw["decode"]})
    picked = sorted({cs[0], cs[len(cs) // 2], cs[-1]})[:shown] if cs else []
    for c in picked:
        k = cs.index(c)
        r = max((r for r in raw["decode"] if r["c"] == c), key=lambda r: r["m"])
        st = np.array(r["steps_s"]) / r["m"] * 1e3
        ctx = r["l_in"] + np.arange(st.size)
        bins = max(3, round((ctx[-1] - ctx[0]) / bin_tokens))
        edges = np.linspace(ctx[0], ctx[-1] + 1, bins + 1)
        which = np.clip(np.digitize(ctx, edges) - 1, 0, bins - 1)
        mid = [(edges[i] + edges[i + 1]) / 2 for i in range(bins) if np.any(which == i)]
        q = np.array([np.percentile(st[which == i], (25, 75)) for i in range(bins) if np.any(which == i)])
        mean = [float(np.mean(st[which == i])) for i in range(bins) if np.any(which == i)]
        ax[0].fill_between(mid, q[:, 0], q[:, 1], color=colors[k % 10], alpha=0.2, lw=0)
        ax[0].plot(mid, mean, "o-", ms=4, color=colors[k % 10], label=f"c={c} (m={r['m']}): mean, quartiles")
    if sheet and picked:
        s_m = raw["block_bytes"]
        kv = raw["cache_bytes_per_block_session_token"]
        xx = np.linspace(raw["decode"][0]["l_in"], max(r["l_in"] + len(r["steps_s"]) for r in raw["decode"]), 20)
        for c in picked:
            ax[0].plot(xx, (s_m + c * kv * xx) / sheet[2] * 1e3, ":", color=colors[cs.index(c) % 10], lw=1.2)
        ax[0].plot([], [], ":", color="0.45", label="dotted, in each c's colour: datasheet (s_m + c·KV bytes)/b")
    ax[0].set(xlabel="context length (tokens)", ylabel="decode step per block (ms)", ylim=(0, None),
              title=f"decode: step time per block vs context\n(c sessions batched; {len(cs)} values of c measured, "
                    f"{len(picked)} shown)")
    for k, c in enumerate(sorted({r["c"] for r in raw["prefill"]})):
        m = max(r["m"] for r in raw["prefill"] if r["c"] == c)
        rs = sorted((r["l_in"], r["median_s"]) for r in raw["prefill"] if r["c"] == c and r["m"] == m)
        ax[1].plot([c * x for x, _ in rs], [y / m for _, y in rs], "o-", color=colors[k % 10], label=f"c={c} (m={m})")
    if sheet:
        tt = np.geomspace(min(r["l_in"] for r in raw["prefill"]),
                          max(r["l_in"] * r["c"] for r in raw["prefill"]), 20)
        ax[1].plot(tt, tt * raw["shape"]["matmul_flops_per_token"] / sheet[1], "k:", label="F/f (datasheet)")
    ax[1].set(xlabel="tokens in the prefill (c × l_in)", ylabel="prefill time per block (s)", xscale="log",
              yscale="log", title="prefill: time per block vs tokens, c sessions batched")
    if graphs:
        dec = [e for e in graphs["graph"] if e.get("tokens", 1) == 1 and "graph_median_s" in e]
        for k, c in enumerate(sorted({e["c"] for e in dec})):
            es = sorted((e for e in dec if e["c"] == c), key=lambda e: e["context"])
            x = [e["context"] for e in es]
            ax[2].plot(x, [e["graph_median_s"] / e["m"] * 1e3 for e in es], "o-", color=colors[k % 10],
                       label=f"c={c}, CUDA graph")
            ax[2].plot(x, [e["eager_median_s"] / e["m"] * 1e3 for e in es], "s--", mfc="none", color=colors[k % 10],
                       label=f"c={c}, eager")
            if sheet:
                xx = np.linspace(0, max(x), 20)
                kv = raw["cache_bytes_per_block_session_token"]
                ax[2].plot(xx, (raw["block_bytes"] + c * kv * xx) / sheet[2] * 1e3, ":", color=colors[k % 10],
                           lw=1)
        ax[2].set(xlabel="context length (tokens)", ylabel="decode step per block (ms)", ylim=(0, None),
                  title="decode step of 32 blocks: eager vs CUDA graph\n(dotted: (s_m + c·KV bytes)/b, datasheet b)")
    for a in ax:
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)  # below: not over the data
    return fig


def memory_figure(mem: dict):
    """memory_sizing.png: measured memory against s_m·k + s_c·k·c."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 5))
    rows = mem["rows"]
    p = np.array([r["predicted_gib"] for r in rows])
    ax.plot(p, [r["static_gib"] for r in rows], "o", label="allocated: weights + cache (static)")
    keys = sorted({k for r in rows for k in r if k.startswith("prefill_") and k.endswith("_extra_gib")})
    for key in keys:
        ax.plot(p, [r["static_gib"] + r[key] for r in rows], "^",
                label=f"peak allocated during a {key.split('_')[1]}-token prefill")
    ax.plot(p, [r["device_used_gib"] for r in rows], "s", mfc="none", label="device memory used (driver)")
    lim = [0, max(r["device_used_gib"] for r in rows) * 1.05]
    ax.plot(lim, lim, "k-", lw=0.8, label="measured = s_m·k + s_c·k·c")
    ax.set(xlabel="predicted s_m·k + s_c·k·c (GiB)", ylabel="measured (GiB)", xlim=lim, ylim=lim,
           title=f"memory sizing, k blocks × c sessions × {mem['tokens_per_session']} tokens")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plots(d: Path, raw: dict, fit: dict, mem: dict | None, sheet: tuple | None) -> None:
    """fig9_gpu.png, tau_concurrency.png, memory_sizing.png."""
    plt = _pyplot()
    for name, fig in (("fig9_gpu.png", fig9_figure(raw, fit, sheet)),
                      ("tau_concurrency.png", concurrency_figure(raw, fit, sheet))):
        fig.savefig(d / name, dpi=130)
        plt.close(fig)
    if mem and mem["rows"] and "static_gib" in mem["rows"][0]:
        fig = memory_figure(mem)
        fig.savefig(d / "memory_sizing.png", dpi=130)
        plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="folder with tau_raw.json (and memory_raw.json); outputs go there")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--plots-only", action="store_true",
                    help="redraw the PNGs from the fit.json already in --dir, writing nothing else (no refit)")
    args = ap.parse_args(argv)
    d = Path(args.dir)
    raw = json.loads((d / "tau_raw.json").read_text())
    mem_raw = json.loads((d / "memory_raw.json").read_text()) if (d / "memory_raw.json").exists() else None
    name = raw["gpu"].get("name", "cpu")
    sheet = datasheet(name)
    if args.plots_only:
        if not (d / "fit.json").is_file():
            print(f"error: --plots-only: {d / 'fit.json'} is missing (run without --plots-only first)", file=sys.stderr)
            return 2
        saved = json.loads((d / "fit.json").read_text())
        graphs = d / "tau_graphs_raw.json"
        graphs_raw = json.loads(graphs.read_text()) if saved.get("graphs") and graphs.exists() else None
        plots(d, raw, {**saved, "graphs_raw": graphs_raw}, saved.get("memory"), sheet)
        return 0
    F = raw["shape"]["matmul_flops_per_token"]
    s_m = raw["block_bytes"]
    fit: dict = {"gpu": name, "dtype": raw["dtype"], "F_flops_per_block_token": F, "s_m_bytes": s_m}
    if sheet:
        fit["datasheet"] = {"label": sheet[0], "tflops": sheet[1] / 1e12, "bandwidth_gb_per_s": sheet[2] / 1e9}
        fit["formula"] = {"t_o_s": REPO_STEP_OVERHEAD_S, "t_in_s": F / sheet[1], "t_out_s": s_m / sheet[2]}
    if raw.get("ceilings"):
        ce = raw["ceilings"]
        fit["formula_measured_ceilings"] = {"t_in_s": F / (ce["gemm_8192_tflops"] * 1e12),
                                            "t_out_s": s_m / (ce["copy_read_plus_write_gb_per_s"] * 1e9)}
    steps_max = max((len(r["steps_s"]) for r in raw["decode"]), default=1)
    louts = sorted({int(x) for x in np.geomspace(2, steps_max + 1, 24)})
    for c in sorted({r["c"] for r in raw["prefill"]}):
        rows = samples(raw, c, louts)
        if len({r[2] for r in rows}) < 2:
            fit[f"c{c}"] = {"direct": direct_estimates(raw, c), "note": "no decode runs at this c: prefill only"}
            continue
        ft = fit_tau(rows)
        entry = {"fit": ft, "direct": direct_estimates(raw, c), "samples": len(rows)}
        if sheet:
            p = ft["per_job_t_o"]
            entry["effective"] = {"tflops": F * c / p["t_in_s"] / 1e12 if c else None,
                                  "bandwidth_gb_per_s": s_m / p["t_out_s"] / 1e9,
                                  "t_in_over_formula": p["t_in_s"] / c / fit["formula"]["t_in_s"],
                                  "t_out_over_formula": p["t_out_s"] / fit["formula"]["t_out_s"],
                                  "tflops_over_datasheet": F * c / p["t_in_s"] / sheet[1],
                                  "bandwidth_over_datasheet": s_m / p["t_out_s"] / sheet[2]}
        fit[f"c{c}"] = entry
    fit["graph_vs_eager"] = raw.get("graph", [])
    fit["sdpa_backend"] = raw.get("sdpa")
    fit["sdpa_backend_probe"] = raw.get("backend_probe", [])
    mem = memory_analysis(mem_raw) if mem_raw else None
    graphs_raw = None
    fit["memory"] = mem
    if (d / "tau_graphs_raw.json").exists():
        graphs_raw = json.loads((d / "tau_graphs_raw.json").read_text())
        fit["graphs"] = graph_analysis(graphs_raw, raw, sheet)
    key = (sheet[0].split()[0].lower() if sheet else "cpu")
    (d / "fit.json").write_text(json.dumps(fit, indent=1))
    if "c1" in fit and "fit" in fit["c1"] and raw["gpu"].get("total_memory_bytes"):
        write_device(d / f"device_{key}.json", raw, fit, mem, sheet, key)
    if not args.no_plots:
        plots(d, raw, {**fit, "graphs_raw": graphs_raw if fit.get("graphs") else None}, mem, sheet)
    # the short table
    print(f"GPU {name}, {raw['dtype']}; F = {F / 1e9:.4f} GFLOP/token/block, s_m = {s_m / 1e6:.1f} MB")
    if sheet:
        fo = fit["formula"]
        print(f"formula ({sheet[0]}: {sheet[1] / 1e12:.0f} TFLOP/s, {sheet[2] / 1e9:.0f} GB/s): "
              f"t_in {fo['t_in_s'] * 1e6:.3f} µs, t_out {fo['t_out_s'] * 1e3:.4f} ms, t_o {fo['t_o_s'] * 1e3:.1f} ms")
    for c in sorted(int(k[1:]) for k in fit if k.startswith("c") and k[1:].isdigit()):
        e = fit[f"c{c}"]
        if "fit" not in e:
            continue
        for variant, p in e["fit"].items():
            print(f"c={c:2d} {variant:14s}: t_o {p['t_o_s'] * 1e3:8.3f} ms  t_in {p['t_in_s'] * 1e6:7.3f} µs  "
                  f"t_out {p['t_out_s'] * 1e3:7.4f} ms  R² {p['r2']:.5f} (log {p['r2_log']:.4f})  "
                  f"rel err median {p['median_rel_err']:.3f} max {p['max_rel_err']:.3f}")
        if "effective" in e:
            ef = e["effective"]
            print(f"      effective {ef['tflops']:.1f} TFLOP/s ({ef['tflops_over_datasheet']:.2f} of datasheet), "
                  f"{ef['bandwidth_gb_per_s']:.0f} GB/s ({ef['bandwidth_over_datasheet']:.2f}); "
                  f"t_in/c / formula {ef['t_in_over_formula']:.2f}, t_out (one step of all c) / formula "
                  f"{ef['t_out_over_formula']:.2f}")
    for how, res in (fit.get("graphs") or {}).items():
        if how in ("graph", "eager") and "decode" in res and "prefill" in res:
            de, pr = res["decode"], res["prefill"]
            print(f"32 blocks, {how:5s}: decode t_out {de['t_out_s'] * 1e3:.4f} ms/block ({de['weights_gb_per_s']:.0f} "
                  f"GB/s of weights) + {de['kv_s_per_session_token'] * 1e9:.2f} ns per session-token of context; "
                  f"prefill t_in {pr['t_in_s'] * 1e6:.3f} µs ({pr['tflops']:.0f} TFLOP/s)")
    if mem and "activation_fit" in mem:
        print(f"memory: static vs s_m·k + s_c·k·c within {mem['static_max_abs_rel_diff']:.4%}; prefill activations "
              f"{mem['activation_fit']['bytes_per_session_token'] / 1e3:.1f} kB per session-token + "
              f"{mem['activation_fit']['constant_bytes'] / 2**20:.0f} MiB; outside the allocator "
              f"{mem['outside_allocator_gib'][0]:.2f}–{mem['outside_allocator_gib'][1]:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
