"""Table 1 on emulated devices, from the replays kept in ``results/table1-emulated/replays/``.

``experiments/table1-emulated.sh --report`` reads every replay (``CONFIG-rR.json`` + ``_requests.csv``), keeps those
whose servers kept the device's time on at least 99 % of their steps, divides every time by the run's dilation k,
and writes ``table1.md`` and ``table1.csv`` (mean response, mean waiting, P95 per configuration beside the paper's
Table 1, paired intervals against PETALS over requests and over replays, the validity share and load average of
each replay) and ``table1.png`` (mean response normalised to PETALS = 100 %, waiting and service stacked).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.experiments.table1_report import PAPER

ORDER = ("petals", "bprr", "jffc_only", "paper", "proposed", "paper-b1", "proposed-b1")
LABELS = {"petals": "PETALS", "bprr": "BPRR", "jffc_only": "JFFC only", "paper": "paper (Alg. 1)",
          "proposed": "proposed", "paper-b1": "paper, 1 at a time", "proposed-b1": "proposed, 1 at a time"}


@dataclass
class Replay:
    """One replay, its times already divided by k (native seconds)."""

    config: str
    round: int
    details: dict[str, Any]
    response: dict[int, float]  # request → response (answered ones, and unfinished ones at the cutoff)
    waiting: dict[int, float]
    censored: int = 0  # requests unfinished at the cutoff (their times are lower bounds)
    failed: int = 0  # requests that ended in an error (left out)

    @property
    def valid(self) -> bool:
        """Whether its servers kept the device's time (≥ 99 % of steps)."""
        return bool(self.details.get("valid"))


def load_replays(out: Path) -> list[Replay]:
    """Every replay that ran, in (round, configuration) order."""
    found = []
    for js in sorted((out / "replays").glob("*-r*.json")):
        details = json.loads(js.read_text())
        if details.get("status") != "ran":
            continue
        k = float(details["time_dilation"])
        resp, wait, censored, failed = {}, {}, 0, 0
        with (js.parent / f"{js.stem}_requests.csv").open() as fh:
            for row in csv.DictReader(fh):
                cut = row["censored"] == "True"  # unfinished at the cutoff: counted there (a lower bound)
                if row["error"] and not cut:
                    failed += 1
                    continue
                censored += cut
                resp[int(row["request"])] = float(row["response_s"]) / k
                wait[int(row["request"])] = float(row["waiting_s"]) / k
        found.append(Replay(details["config"], int(details["round"]), details, resp, wait, censored, failed))
    return sorted(found, key=lambda r: (r.round, ORDER.index(r.config) if r.config in ORDER else 99))


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): Student-t 95 % interval of the mean (nan bounds with fewer than 2 values)."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return (float(x.mean()) if x.size else math.nan), math.nan, math.nan
    half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def summarize(replays: Sequence[Replay]) -> dict[str, dict[str, Any]]:
    """Per configuration over its valid replays: pooled mean response/waiting and P95, and the paired differences
    against PETALS (over requests: every pair of the same request in the same round; over replays: the rounds'
    mean differences)."""
    valid = [r for r in replays if r.valid]
    petals = {r.round: r for r in valid if r.config == "petals"}
    out: dict[str, dict[str, Any]] = {}
    for config in ORDER:
        mine = [r for r in valid if r.config == config]
        if not mine:
            continue
        resp = np.concatenate([list(r.response.values()) for r in mine])
        wait = np.concatenate([list(r.waiting.values()) for r in mine])
        row: dict[str, Any] = {"replays": len(mine), "requests": int(resp.size), "response_mean": float(resp.mean()),
                               "waiting_mean": float(wait.mean()), "response_p95": float(np.percentile(resp, 95)),
                               "validity": [round(r.details["validity"]["valid_share"], 4) for r in mine],
                               "censored": sum(r.censored for r in mine), "failed": sum(r.failed for r in mine),
                               "loadavg": [r.details.get("loadavg_1m") for r in mine]}
        if config != "petals":
            pairs, rounds = [], []
            for r in mine:
                base = petals.get(r.round)
                if base is None:
                    continue
                shared = sorted(set(r.response) & set(base.response))
                pairs += [base.response[i] - r.response[i] for i in shared]
                rounds.append(np.mean([base.response[i] for i in shared]) - np.mean([r.response[i] for i in shared]))
            row["saving_by_request"] = t_interval(pairs)
            row["saving_by_replay"] = t_interval(rounds)
            row["paired_requests"], row["paired_rounds"] = len(pairs), len(rounds)
        out[config] = row
    if "petals" in out:
        base = out["petals"]["response_mean"]
        for row in out.values():
            row["vs_petals_pct"] = 100.0 * (1.0 - row["response_mean"] / base)
    return out


def _paper(config: str) -> dict[str, float] | None:
    """The paper's Table 1 row of a configuration (its testbed ran one-at-a-time servers: paper-b1 / proposed-b1)."""
    method = config.removesuffix("-b1")
    return PAPER.get(method)


def markdown(summary: dict[str, dict[str, Any]], replays: Sequence[Replay], plan_lines: Sequence[str]) -> str:
    """The table beside the paper's, the paired intervals and every replay's validity and load."""
    lines = ["# Table 1 on emulated A100 slices (time-dilated replay of the code trace)", "", *plan_lines, "",
             "| configuration | replays | mean response (s) | mean waiting (s) | P95 (s) | below PETALS | paper: "
             "response / waiting / below PETALS |", "|---|---|---|---|---|---|---|"]
    base = PAPER["petals"]["response_mean"]
    for config, row in summary.items():
        p = _paper(config)
        paper = (f"{p['response_mean']:.1f} / {p['waiting_mean']:.1f} / "
                 f"{100 * (1 - p['response_mean'] / base):.1f} %" if p else "–")
        below = "–" if config == "petals" else f"{row['vs_petals_pct']:.1f} %"
        lines.append(f"| {LABELS[config]} | {row['replays']} | {row['response_mean']:.2f} | {row['waiting_mean']:.2f} "
                     f"| {row['response_p95']:.2f} | {below} | {paper} |")
    lines += ["", "Paired against PETALS (PETALS − configuration, native seconds, Student-t 95 %):", ""]
    for config, row in summary.items():
        if config == "petals" or "saving_by_request" not in row:
            continue
        m, lo, hi = row["saving_by_request"]
        rm, rlo, rhi = row["saving_by_replay"]
        lines.append(f"- {LABELS[config]}: over {row['paired_requests']} request pairs {m:+.2f} s [{lo:+.2f}, "
                     f"{hi:+.2f}]; over {row['paired_rounds']} rounds {rm:+.2f} s [{rlo:+.2f}, {rhi:+.2f}]")
    cut = {c: row["censored"] for c, row in summary.items() if row["censored"] or row["failed"]}
    if cut:
        lines += ["", "Unfinished at the cutoff (counted there, so those means are lower bounds) or failed: "
                  + "; ".join(f"{LABELS[c]} {summary[c]['censored']} / {summary[c]['failed']}" for c in cut)]
    lines += ["", "| replay | status | device time kept | load average before / after | response / waiting (s) |",
              "|---|---|---|---|---|"]
    for r in replays:
        v = r.details["validity"]
        times = "–"  # a replay whose servers did not keep the device's time is not reported
        if r.valid and r.response:
            times = f"{np.mean(list(r.response.values())):.2f} / {np.mean(list(r.waiting.values())):.2f}"
        lines.append(f"| {r.config} r{r.round} | {'valid' if r.valid else 'INVALID: not reported'} | "
                     f"{100 * v['valid_share']:.2f} % of {v['steps']} steps | {r.details.get('loadavg_1m')} | "
                     f"{times} |")
    return "\n".join(lines) + "\n"


def figure(path: Path, summary: dict[str, dict[str, Any]], plan: dict[str, Any] | None = None) -> Path | None:
    """Mean response per configuration, PETALS = 100 %, split into waiting and service; the paper's beside it."""
    from petals_chain.experiments.common import figure as new_figure
    from petals_chain.experiments.common import save_figure

    if "petals" not in summary:
        return None
    base = summary["petals"]["response_mean"]
    configs = list(summary)
    fig, axes = new_figure(figsize=(8.5, 4.4))
    ax = axes[0][0]
    x = np.arange(len(configs))
    wait = [100 * summary[c]["waiting_mean"] / base for c in configs]
    serve = [100 * (summary[c]["response_mean"] - summary[c]["waiting_mean"]) / base for c in configs]
    ax.bar(x - 0.2, wait, 0.38, color="#d62728", label="waiting (ours)")
    ax.bar(x - 0.2, serve, 0.38, bottom=wait, color="#1f77b4", label="service (ours)")
    pb = PAPER["petals"]["response_mean"]
    for i, c in enumerate(configs):
        p = _paper(c)
        if p:
            ax.bar(i + 0.2, 100 * p["waiting_mean"] / pb, 0.38, color="#d62728", alpha=0.35)
            ax.bar(i + 0.2, 100 * (p["response_mean"] - p["waiting_mean"]) / pb, 0.38,
                   bottom=100 * p["waiting_mean"] / pb, color="#1f77b4", alpha=0.35,
                   label="paper (light)" if i == 0 else None)
    ax.set_xticks(x, [LABELS[c] for c in configs], rotation=20, ha="right")
    ax.set_ylabel("mean response, PETALS = 100 %")
    plan = plan or {}
    rows = (f"rows {plan['skip']}–{plan['skip'] + plan['requests'] - 1}" if plan.get("requests") else "code trace")
    ks = sorted(set(plan.get("dilations", [])) or ({plan["time_dilation"]} if plan.get("time_dilation") else set()))
    k = f", time × {' and '.join(f'{x:g}' for x in ks)}" if ks else ""
    ax.set_title(f"Table 1 on emulated A100 MIG slices (LLaMA-2-7B timing): {rows} at native pace{k}", fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def report(out: Path) -> list[str]:
    """Write table1.md / .csv / .png into ``out``; return the Markdown's lines."""
    replays = load_replays(out)
    if not replays:
        return [f"no replays in {out / 'replays'} yet (experiments/table1-emulated.sh runs them)"]
    plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").is_file() else {}
    summary = summarize(replays)
    plan["dilations"] = [float(r.details["time_dilation"]) for r in replays if r.valid]  # each replay's own k
    text = markdown(summary, replays, plan.get("lines", []))
    (out / "table1.md").write_text(text)
    with (out / "table1.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["configuration", "replays", "requests", "response_mean_s", "waiting_mean_s", "response_p95_s",
                    "below_petals_pct", "saving_by_request_s", "low", "high", "saving_by_replay_s", "low", "high"])
        for config, row in summary.items():
            sr = row.get("saving_by_request", (math.nan,) * 3)
            sp = row.get("saving_by_replay", (math.nan,) * 3)
            w.writerow([config, row["replays"], row["requests"], row["response_mean"], row["waiting_mean"],
                        row["response_p95"], row.get("vs_petals_pct", math.nan), *sr, *sp])
    figure(out / "table1.png", summary, plan)
    return text.splitlines()
