"""Fit the emulated device's step-time constants (petals_chain.device_profile) to our GPU measurements, and check them.

``python -m petals_chain.experiments.device_fit [--out results/table1-emulated]`` reads the committed measurements
(``results/gpu/tau_graphs_raw.json``: an H100's eager and CUDA-graph steps of LLaMA-2-7B-shaped blocks;
``results/gpu-batched/batched.csv``: our batched arena step on an H200), fits h0, h1, t_in, w and kv, prints every
measured point beside the model (relative error), and writes ``device_fit.json``. Exit 1 when the constants embedded in
``device_profile`` are more than 1 % off the fit (they are then stale: paste the printed ones).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain import device_profile as dp
from petals_chain.experiments.common import REPO

GPU = REPO / "results" / "gpu" / "tau_graphs_raw.json"
BATCHED = REPO / "results" / "gpu-batched" / "batched.csv"
H200_TBPS = 4.8  # H200 datasheet bandwidth (its TFLOP/s are the H100's)
NAMES = {"host_s": "H100_HOST_S", "batch_host_s": "BATCH_HOST_S", "t_in_s": "H100_T_IN_S",
         "weights_s": "H100_WEIGHTS_S", "kv_s": "H100_KV_S"}


def load_points(gpu: Path = GPU, batched: Path = BATCHED) -> dict[str, list[dict[str, float]]]:
    """Per-block measured step times: H100 decode (eager, graph), H100 prefill (eager), H200 batched arena."""
    raw = json.loads(gpu.read_text())["graph"]
    decode = [{"b": g["c"], "context": g["context"], "eager": g["eager_median_s"] / g["m"],
               "graph": g["graph_median_s"] / g["m"]} for g in raw if g["tokens"] == 1]
    prefill = [{"b": g["c"], "tokens": g["tokens"], "eager": g["eager_median_s"] / g["m"]}
               for g in raw if g["tokens"] > 1]
    with open(batched, newline="") as f:
        arena = [{"b": int(r["b"]), "context": float(r["mean_context"]), "step": float(r["arena_ms"]) / 1e3 / 8}
                 for r in csv.DictReader(f) if r["context"] in ("128", "1024")]
    return {"decode": decode, "prefill": prefill, "arena": arena}


def fit(points: dict[str, list[dict[str, float]]]) -> dict[str, float]:
    """The five constants: w, kv by least squares on graph decode; h0 the median eager decode where the host binds
    (eager above 1.1 × graph); t_in through the origin on prefills of ≥ 512 tokens; h1 the slope of the arena step
    over sessions (b ≤ 32)."""
    dec = points["decode"]
    a = np.array([[1.0, d["b"] * (d["context"] + 1)] for d in dec])
    w, kv = np.linalg.lstsq(a, np.array([d["graph"] for d in dec]), rcond=None)[0]
    host = float(np.median([d["eager"] for d in dec if d["eager"] > 1.1 * d["graph"]]))
    pre = [p for p in points["prefill"] if p["tokens"] >= 512]
    x = np.array([p["tokens"] * p["b"] for p in pre], dtype=float)
    t_in = float(x @ np.array([p["eager"] for p in pre]) / (x @ x))
    ar = [r for r in points["arena"] if r["b"] <= 32]
    slope = float(np.polyfit([r["b"] for r in ar], [r["step"] for r in ar], 1)[0])
    return {"host_s": host, "batch_host_s": slope, "t_in_s": t_in, "weights_s": float(w), "kv_s": float(kv)}


def compare(points: dict[str, list[dict[str, float]]], profile: dp.DeviceProfile) -> list[dict[str, Any]]:
    """Every measured point beside the model's value for it (the H200's bandwidth terms scaled from the H100's)."""
    rows: list[dict[str, Any]] = []
    for d in points["decode"]:
        model = profile.block_step_s([1] * d["b"], [d["context"]] * d["b"])
        rows.append({"set": "H100 decode (eager)", "b": d["b"], "context": d["context"], "tokens": 1,
                     "measured_s": d["eager"], "model_s": model})
    for p in points["prefill"]:
        model = profile.block_step_s([p["tokens"]] * p["b"], [0] * p["b"])
        rows.append({"set": "H100 prefill (eager)", "b": p["b"], "context": 0, "tokens": p["tokens"],
                     "measured_s": p["eager"], "model_s": model})
    h200 = dp.replace(profile, weights_s=profile.weights_s * dp.H100_TBPS / H200_TBPS,
                      kv_s=profile.kv_s * dp.H100_TBPS / H200_TBPS)
    one = {r["context"]: r["step"] for r in points["arena"] if r["b"] == 1}
    for r in points["arena"]:
        # the arena's own b = 1 step runs our batched kernels, not PETALS' block: compare the growth over b = 1
        growth = (h200.block_step_s([1] * r["b"], [int(r["context"])] * r["b"])
                  / h200.block_step_s([1], [int(r["context"])]))
        rows.append({"set": "H200 arena, step(b) / step(1)", "b": r["b"], "context": r["context"], "tokens": 1,
                     "measured_s": r["step"] / one[r["context"]], "model_s": growth})
    for row in rows:
        row["rel_err"] = row["model_s"] / row["measured_s"] - 1.0
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Fit, print, write device_fit.json; exit 1 if the embedded constants are stale."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.experiments.device_fit", description=__doc__)
    p.add_argument("--out", type=Path, default=REPO / "results" / "table1-emulated")
    args = p.parse_args(argv)
    points = load_points()
    fitted = fit(points)
    profile = dp.replace(dp.h100(), **fitted)
    rows = compare(points, profile)
    for name, value in fitted.items():
        print(f"{NAMES[name]} = {value:.4e}")
    for label in dict.fromkeys(r["set"] for r in rows):
        errs = np.array([r["rel_err"] for r in rows if r["set"] == label])
        print(f"{label}: {errs.size} points, model/measured − 1: median {np.median(errs):+.1%}, "
              f"range {errs.min():+.1%} … {errs.max():+.1%}")
    for name in dp.DEVICES:
        d = dp.device(name)
        print(f"{name}: decode step of one session at 2048 context {d.block_step_s([1], [2048]) * 1e3:.3f} ms/block, "
              f"prefill of 2048 tokens {d.block_step_s([2048], [0]) * 1e3:.2f} ms/block, "
              f"τp(2048 in, 28 out) {d.job_s(2048, 28) * 1e3:.1f} ms/block")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "device_fit.json").write_text(json.dumps(
        {"fitted": fitted, "sources": [str(GPU.relative_to(REPO)), str(BATCHED.relative_to(REPO))],
         "devices": {n: dp.device(n).__dict__ for n in dp.DEVICES}, "points": rows}, indent=1) + "\n")
    stale = [NAMES[k] for k, v in fitted.items() if abs(getattr(dp.h100(), k) / v - 1) > 0.01]
    if stale:
        print(f"embedded constants off the fit by > 1 %: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
