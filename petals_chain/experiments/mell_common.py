"""What the Mell figures share (docs/mell.md, "Experiments"): the two GPU settings, the four workloads, the
policies, and one simulation grid run once per process and reused by Figs 11, 12, 14 and 15."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from petals_chain.experiments.common import mean_ci
from petals_chain.experiments.paper import run_seeds
from petals_chain.mell.baselines import FitScheduler, LoadBalanceScheduler
from petals_chain.mell.classes import SETTINGS, kv_capacity_tokens
from petals_chain.mell.scheduler import MellScheduler
from petals_chain.mell.sim import SimConfig, SimResult, simulate
from petals_chain.mell.workloads import (azure_arrivals, build_workload, poisson_arrivals, sharegpt_lengths)

# Poisson mean gaps (s) for the paper's "frequent, middle, infrequent" (λ = 0.5, 0.8, 1.1 read as gaps)
RATES = {"poisson-high": 0.5, "poisson-mid": 0.8, "poisson-low": 1.1}
AZURE_GAP_S = 0.8  # Azure conversation arrivals, stretched to the middle rate
WORKLOADS = (*RATES, "azure")
TPOT_S = {"7b-4090": 0.025, "13b-a100": 0.035}
GPUS_PER_MACHINE = {"7b-4090": 8, "13b-a100": 4}
MAIN = ("Mell", "BF", "WF", "LB")
PREEMPT = ("BF-p", "WF-p", "LB-p")


@dataclass(frozen=True)
class Scale:
    """How much to simulate: requests per run and runs (seeds) per cell."""

    requests: int
    runs: int


def scale(quick: bool) -> Scale:
    return Scale(600, 2) if quick else Scale(2000, 5)


def config(setting: str) -> SimConfig:
    """The simulated cluster of one setting: C from the model's real KV size on that GPU."""
    model, gpu = SETTINGS[setting]
    return SimConfig(kv_capacity_tokens(model, gpu), model.kv_bytes_per_token, tpot_s=TPOT_S[setting],
                     gpus_per_machine=GPUS_PER_MACHINE[setting])


def make_policy(name: str, capacity: int):
    """A fresh scheduler by name (``-p``: the baseline preempts on overflow instead of reserving)."""
    table = {
        "Mell": lambda: MellScheduler(capacity),
        "Mell-nobatch": lambda: MellScheduler(capacity, batching=False),
        "BF": lambda: FitScheduler(capacity, "best"), "WF": lambda: FitScheduler(capacity, "worst"),
        "FF": lambda: FitScheduler(capacity, "first"), "LB": lambda: LoadBalanceScheduler(capacity),
        "BF-p": lambda: FitScheduler(capacity, "best", reserve=False),
        "WF-p": lambda: FitScheduler(capacity, "worst", reserve=False),
        "LB-p": lambda: LoadBalanceScheduler(capacity, reserve=False),
    }
    return table[name]()


def workload(name: str, setting: str, n: int, rng: np.random.Generator):
    """One of the four workloads: Poisson at three rates or Azure arrivals; ShareGPT lengths ×10."""
    cap = config(setting).capacity_tokens
    if name == "azure":
        start = int(rng.integers(0, 19_000 - n)) if n < 19_000 else 0
        arrivals = azure_arrivals(n, AZURE_GAP_S, start=start)
    else:
        arrivals = poisson_arrivals(RATES[name], n, rng)
    return build_workload(arrivals, sharegpt_lengths(), cap, rng)


def run_grid(args, policies, workloads=WORKLOADS, settings=tuple(SETTINGS), desc: str = "mell grid"
             ) -> tuple[list[dict], dict[tuple, SimResult]]:
    """Every (setting, workload, run) on the same arrivals for each policy; rows and the raw results."""
    sc = scale(args.quick)
    rows, raw = [], {}
    cells = [(s, w) for s in settings for w in workloads]
    with tqdm(total=len(cells) * sc.runs * len(policies), desc=desc, unit="sim") as bar:
        for s, w in cells:
            cfg = config(s)
            for r, rng in enumerate(run_seeds(args.seed + 7919 * hash_name(s + w), sc.runs)):
                wl = workload(w, s, sc.requests, rng)
                for p in policies:
                    res = simulate(make_policy(p, cfg.capacity_tokens), wl, cfg)
                    raw[(s, w, r, p)] = res
                    rows.append({"setting": s, "workload": w, "run": r, "policy": p,
                                 "capacity_tokens": cfg.capacity_tokens, "peak_gpus": res.peak_gpus,
                                 "mean_gpus": res.mean_gpus, "utilisation": res.utilisation,
                                 "migrations": res.migrations, "migrations_raw": res.migrations_raw,
                                 "migrations_per_s": res.migrations_per_s, "preemptions": res.preemptions,
                                 "max_moves_per_op": res.max_moves_per_op, "stall_s": res.stall_s,
                                 "item_migrations": res.item_migrations,
                                 "item_migrations_per_s": res.item_migrations_per_s,
                                 "sweep_migrations": res.sweep_migrations,
                                 "sweep_item_migrations": res.sweep_item_migrations,
                                 "paper_migrations_per_s": res.paper_migrations_per_s,
                                 "max_item_moves_per_op": res.max_item_moves_per_op,
                                 "overfull_gpu_slots": res.overfull_gpu_slots,
                                 "kv_moves": res.modes.get("kv", 0), "token_moves": res.modes.get("token", 0),
                                 "deferred_moves": res.modes.get("defer", 0)})
                    bar.update()
    return rows, raw


def hash_name(text: str) -> int:
    """A small stable integer of a string (Python's hash() is salted per process)."""
    return sum((k + 1) * ord(c) for k, c in enumerate(text)) % 10_007


def cell(rows, setting: str, wl: str, policy: str, key: str) -> tuple[float, float]:
    """Mean and 95 % half-width of ``key`` over the runs of one cell."""
    return mean_ci([x[key] for x in rows if x["setting"] == setting and x["workload"] == wl
                    and x["policy"] == policy])


def reduction(rows, setting: str, wl: str, policy: str, base: str, key: str = "peak_gpus") -> float:
    """Per cent fewer ``key`` for ``policy`` than ``base`` (means over runs)."""
    a, _ = cell(rows, setting, wl, policy, key)
    b, _ = cell(rows, setting, wl, base, key)
    return 100 * (b - a) / b if b else float("nan")


_GRID: dict[tuple, tuple[list[dict], dict]] = {}


def shared_grid(args) -> tuple[list[dict], dict]:
    """The Figs 11/12/14/15 grid (main policies and their preempting variants), computed once per process."""
    key = (args.quick, args.seed)
    if key not in _GRID:
        _GRID[key] = run_grid(args, MAIN + PREEMPT)
    return _GRID[key]


GRID_INTS = ("run", "capacity_tokens", "peak_gpus", "migrations", "migrations_raw", "preemptions", "max_moves_per_op",
             "kv_moves", "token_moves", "deferred_moves", "item_migrations", "sweep_migrations",
             "sweep_item_migrations", "max_item_moves_per_op", "overfull_gpu_slots")  # integer columns of the grid CSVs


def has_column(rows: list[dict], key: str) -> bool:
    """Whether the grid rows carry ``key`` (CSVs written before a column existed lack it: say n/a, don't rerun)."""
    return bool(rows) and all(key in r and r[key] != "" for r in rows)


def grid_rows(args, name: str, policies=MAIN + PREEMPT) -> list[dict]:
    """The grid's rows for the figure ``name``: simulated (the shared grid, or a grid of ``policies`` of its own)
    and written to ``name``.csv, or with ``--replot`` read back from that CSV, nothing simulated."""
    from petals_chain.experiments.common import read_csv, replotting, write_csv

    path = args.out / f"{name}.csv"
    if replotting(args):
        rows = read_csv(path)
        for r in rows:
            r.update({k: int(r[k]) for k in GRID_INTS if k in r})
        return rows
    rows = shared_grid(args)[0] if tuple(policies) == MAIN + PREEMPT else \
        run_grid(args, policies, desc=f"{name} grid")[0]
    write_csv(path, rows)
    return rows


POLICY_COLOURS = {"Mell": "tab:blue", "BF": "tab:orange", "WF": "tab:green", "LB": "tab:red", "FF": "tab:purple"}


def policy_style(policy: str) -> dict:
    """Bar style of a policy: a colour per base policy; its preempting (-p) or unbatched variant the same colour,
    lighter and hatched, so that seven bars read as four families."""
    base = policy.removesuffix("-p").removesuffix("-nobatch")
    colour = POLICY_COLOURS.get(base, "tab:gray")
    if base == policy:
        return {"facecolor": colour, "edgecolor": "white", "lw": 0.3}
    return {"facecolor": colour, "alpha": 0.45, "hatch": "//", "edgecolor": "black", "lw": 0.3}


def bar_figure(rows, key: str, policies, ylabel: str, title: str, settings=tuple(SETTINGS)):
    """One panel per setting: bars of ``key`` (mean ± 95 % CI over runs) per workload and policy; one legend for
    the figure, below the panels."""
    from matplotlib.patches import Patch

    from petals_chain.experiments.common import figure

    fig, axes = figure(1, len(settings), figsize=(6.5 * len(settings), 4.6))
    width = 0.8 / len(policies)
    for ax, s in zip(axes[0], settings):
        for k, p in enumerate(policies):
            vals = [cell(rows, s, w, p, key) for w in WORKLOADS]
            ax.bar(np.arange(len(WORKLOADS)) + (k - (len(policies) - 1) / 2) * width, [v for v, _ in vals], width,
                   yerr=[0 if np.isnan(h) else h for _, h in vals], capsize=2, **policy_style(p))
        ax.set_xticks(np.arange(len(WORKLOADS)), WORKLOADS)
        ax.grid(axis="x", visible=False)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{s} (C = {config(s).capacity_tokens} tokens)")
    fig.legend(handles=[Patch(label=p, **policy_style(p)) for p in policies], loc="outside lower center",
               ncol=len(policies), frameon=False)
    fig.suptitle(title)
    return fig


def bar_panels(rows, key: str, policies, ylabel: str, title: str, path, settings=tuple(SETTINGS)) -> None:
    """Draw :func:`bar_figure` to ``path``."""
    from petals_chain.experiments.common import save_figure

    save_figure(bar_figure(rows, key, policies, ylabel, title, settings), path)


def command(name: str, args) -> str:
    return f"python -m petals_chain.experiments {name}{' --quick' if args.quick else ''} --seed {args.seed}"
