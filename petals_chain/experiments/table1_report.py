"""Table 1's outputs: the paper's figures, the measured table next to them (CSV, Markdown), and the plot."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Collection, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.compose.method_table import METHODS
from petals_chain.experiments.common import mean_ci
from petals_chain.experiments.limit import LimitCheck, plot_limits
from petals_chain.experiments.replay import METRICS, ReplayPlan, ReplayResult, RequestRecord, check_littles_law

# The paper's Table 1 columns (methods of METHODS) and ``paper``: the paper's own scheme (Algorithm 1 at c = 35, the
# paper's "proposed" column) next to petals_chain's default ``proposed``.
METHOD_ORDER = ("petals", "bprr", "jffc_only", "paper", "proposed")

# Paper Table 1 (seconds, the paper's A100 MIG testbed).
PAPER: dict[str, dict[str, float]] = {
    "petals": {"response_mean": 31.4, "response_median": 27.8, "response_p95": 68.5, "response_p99": 89.3,
               "waiting_mean": 24.2, "waiting_median": 20.5, "waiting_p95": 61.3, "waiting_max": 142.6,
               "service_mean": 7.2, "service_median": 5.8, "service_p95": 18.9},
    "bprr": {"response_mean": 19.8, "response_median": 16.9, "response_p95": 44.2, "response_p99": 61.7,
             "waiting_mean": 12.6, "waiting_median": 9.7, "waiting_p95": 37.1, "waiting_max": 98.4,
             "service_mean": 7.2, "service_median": 5.9, "service_p95": 18.7},
    "jffc_only": {"response_mean": 10.0, "response_median": 8.5, "response_p95": 22.1, "response_p99": 29.6,
                  "waiting_mean": 1.5, "waiting_median": 0.1, "waiting_p95": 7.8, "waiting_max": 25.1,
                  "service_mean": 8.5, "service_median": 7.2, "service_p95": 20.3},
    "proposed": {"response_mean": 7.3, "response_median": 6.5, "response_p95": 15.2, "response_p99": 21.4,
                 "waiting_mean": 0.6, "waiting_median": 0.1, "waiting_p95": 4.8, "waiting_max": 24.3,
                 "service_mean": 6.7, "service_median": 5.7, "service_p95": 18.2},
}
PAPER["paper"] = PAPER["proposed"]  # the paper's "proposed" is its Algorithm 1, which our ``paper`` runs
PAPER_REDUCTION_PCT = {"petals": 0.0, "bprr": 36.9, "jffc_only": 68.2, "paper": 76.8, "proposed": 76.8}
ROWS = (("response mean / median", "response_mean", "response_median"),
        ("response P95 / P99", "response_p95", "response_p99"),
        ("waiting mean / median", "waiting_mean", "waiting_median"),
        ("waiting P95 / max", "waiting_p95", "waiting_max"),
        ("service mean / median", "service_mean", "service_median"),
        ("service P95", "service_p95", None))


def improvement_pct(value: float, petals: float) -> float:
    """Reduction of a time vs PETALS, percent (positive = faster than PETALS)."""
    return 100.0 * (petals - value) / petals if petals > 0 else math.nan


# ---- outputs ---------------------------------------------------------------------------------------------------


def write_requests_csv(path: Path, records: Sequence[RequestRecord]) -> Path:
    """Per-request records as CSV, one column per field (empty file when there are none)."""
    rows = [asdict(r) for r in records]
    with path.open("w", newline="") as fh:
        if rows:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return path


def write_outputs(out_dir: Path, stem: str, stats: dict[str, dict[str, float]], results: dict[str, ReplayResult],
                  plan: ReplayPlan, infos: dict[str, dict[str, Any]], command: str) -> dict[str, Path]:
    """results/STEM.csv (measured next to paper), STEM.md, STEM.png, STEM_details.json, STEM_requests.csv and
    STEM_samples.csv (the in-flight counts the Little's-law check used)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    base = stats.get("petals", {}).get("response_mean", math.nan)
    rows = []
    for m in METHOD_ORDER:
        s = stats.get(m)
        for metric in METRICS:
            ours = s.get(metric, math.nan) if s else math.nan
            pv = stats.get("petals", {}).get(metric, math.nan)
            rows.append({"method": m, "metric": metric, "measured_s": ours, "paper_s": PAPER[m][metric],
                         "improvement_vs_petals_pct": improvement_pct(ours, pv) if m != "petals" else 0.0,
                         "paper_improvement_vs_petals_pct": improvement_pct(PAPER[m][metric],
                                                                            PAPER["petals"][metric]),
                         "status": infos.get(m, {}).get("status", "not run")})
    paths["csv"] = out_dir / f"{stem}.csv"
    with paths["csv"].open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    paths["requests"] = write_requests_csv(out_dir / f"{stem}_requests.csv",
                                           [r for res in results.values() for r in res.records])
    paths["samples"] = out_dir / f"{stem}_samples.csv"  # the monitor's in-flight counts: Little's law can be redone
    with paths["samples"].open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "time_s", "in_flight"])
        w.writerows((m, f"{s_t:.4f}", int(s_n)) for m, res in results.items() for s_t, s_n in res.samples)
    paths["md"] = out_dir / f"{stem}.md"
    paths["md"].write_text(markdown(stats, plan, infos, results, command, base))
    paths["png"] = plot(out_dir / f"{stem}.png", stats, results)
    limits = limit_checks(infos, results)
    if limits:  # the distance to the limit of every JFFC replay (fixed chains)
        paths["limit"] = plot_limits(out_dir / f"{stem}_limit.png", limits, LIMIT_TITLE)
    paths["json"] = out_dir / f"{stem}_details.json"
    paths["json"].write_text(json.dumps({"command": command, "plan": plan.describe(), "stats": stats,
                                         "infos": infos, "paper": PAPER}, indent=1, default=str))
    return paths


def _cell(s: dict[str, float] | None, a: str, b: str | None) -> str:
    """'x / y' (or 'x') in seconds, or a dash where nothing was measured."""
    if not s or not math.isfinite(s.get(a, math.nan)):
        return "–"
    return f"{s[a]:.1f}" if b is None else f"{s[a]:.1f} / {s[b]:.1f}"


def markdown(stats: dict[str, dict[str, float]], plan: ReplayPlan, infos: dict[str, dict[str, Any]],
             results: dict[str, ReplayResult], command: str, petals_mean: float) -> str:
    """Table 1 measured here next to the paper's, with the scalings, the methods' set-ups and Little's law."""
    head = "| metric (s) | " + " | ".join(f"{n} (here)" for n in _labels()) + " |"
    lines = ["# Table 1, live on the CPU-emulated testbed", "", f"Command: `{command}`", ""]
    lines += [f"- {d}" for d in plan.describe()]
    lines += ["", head, "|---" * (len(METHOD_ORDER) + 1) + "|"]
    for label, a, b in ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(stats.get(m), a, b) for m in METHOD_ORDER) + " |")
    red = []
    for m in METHOD_ORDER:
        s = stats.get(m)
        red.append("–" if m == "petals" or not s else f"{improvement_pct(s['response_mean'], petals_mean):.1f} %")
    lines.append("| mean response reduction vs PETALS | " + " | ".join(red) + " |")
    lines += ["", "Paper (LLaMA-2-7B on 3 × 3g.40gb + 6 × 2g.20gb, first 1000 requests, c = 35):", "",
              "| metric (s) | " + " | ".join(_labels()) + " |", "|---" * (len(METHOD_ORDER) + 1) + "|"]
    for label, a, b in ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(PAPER[m], a, b) for m in METHOD_ORDER) + " |")
    lines.append("| mean response reduction vs PETALS | – | "
                 + " | ".join(f"{PAPER_REDUCTION_PCT[m]:.1f} %" for m in METHOD_ORDER[1:]) + " |")
    lines += ["", "The paper's \"proposed\" column (its Algorithm 1 at c = 35) appears under both `paper` (that "
              "composition, run here at its design rate) and `proposed` (petals_chain's default)."]
    lines += ["", "Methods as run:", ""]
    for m in METHOD_ORDER:
        info = infos.get(m, {})
        lines.append(f"- **{_labels()[METHOD_ORDER.index(m)]}**: {info.get('status', 'not run')}; "
                     f"{info.get('summary', '')}")
    lines += ["", "Checks (Little's law: sampled mean in flight vs λ̂·W̄ from the records):", ""]
    for m, res in results.items():
        s = stats[m]
        little = check_littles_law(res)
        if s.get("censored"):
            lines.append(f"- {m}: {int(s['censored'])} request(s) still waiting at the cutoff are counted at the "
                         "cutoff: its response and waiting figures are lower bounds")
        lines.append(f"- {m}: {int(s['served'])}/{int(s['requests'])} served, mean failed routing attempts "
                     f"{s.get('failed_attempts_mean', math.nan):.2f}, replay wall {res.wall_s:.0f} s; "
                     + ("" if little.ok else "**") + little.describe() + ("" if little.ok else "**"))
    return "\n".join(lines) + "\n"


def _labels() -> list[str]:
    """Column labels in method order."""
    return [METHODS[m].label for m in METHOD_ORDER]


def table1_figure(stats: dict[str, dict[str, float]], results: dict[str, ReplayResult]):
    """Bars of mean waiting + service per method, measured here (CPU seconds, with the 95 % interval of the mean
    response over the requests) and the paper's (A100 seconds, which it gives without intervals) on separate axes,
    since the two testbeds' seconds are not comparable; right: every request's response time here (a box of the
    quartiles over the points themselves: with tens of requests a CDF is a staircase that hides how few they are)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from petals_chain.experiments.common import figure

    fig, axes = figure(1, 3, figsize=(16, 5.2))
    a, p, b = axes[0]
    labels = _labels()
    x = np.arange(len(METHOD_ORDER))
    resp = {m: np.array([q.response_s for q in results[m].records if not q.error and math.isfinite(q.response_s)])
            for m in METHOD_ORDER if m in results}
    counts = [f"{lab}\n(n = {resp[m].size})" if m in resp else lab for m, lab in zip(METHOD_ORDER, labels)]
    for ax, src, title in ((a, stats, "here: CPU-emulated testbed, SmolLM2 (CPU seconds)"),
                           (p, PAPER, "paper: LLaMA-2-7B on A100 MIG slices\n(A100 seconds; no intervals given)")):
        wait = np.array([src.get(m, {}).get("waiting_mean", math.nan) for m in METHOD_ORDER])
        svc = np.array([src.get(m, {}).get("service_mean", math.nan) for m in METHOD_ORDER])
        ax.bar(x, wait, 0.6, color="tab:red")
        ax.bar(x, svc, 0.6, bottom=np.nan_to_num(wait), color="tab:blue")
        if src is stats:
            half = [mean_ci(resp[m])[1] if m in resp and resp[m].size > 1 else math.nan for m in METHOD_ORDER]
            ax.errorbar(x, np.nan_to_num(wait) + svc, yerr=np.nan_to_num(half), fmt="none", ecolor="black",
                        capsize=4)
        ax.set_xticks(x, counts if src is stats else labels, fontsize=8)
        ax.set(ylabel="mean time (s)", title=f"mean response = waiting + service\n{title}")
    rng = np.random.default_rng(0)  # the jitter of the points only
    shown = [m for m in METHOD_ORDER if m in resp and resp[m].size]
    if shown:
        b.boxplot([resp[m] for m in shown], positions=[METHOD_ORDER.index(m) for m in shown], widths=0.5,
                  showfliers=False, medianprops={"color": "black"})
        for m in shown:
            k = METHOD_ORDER.index(m)
            b.plot(k + rng.uniform(-0.18, 0.18, resp[m].size), resp[m], "o", ms=3, alpha=0.6, color="tab:blue")
    b.set_xticks(x, counts, fontsize=8)
    b.set_xlim(-0.6, len(METHOD_ORDER) - 0.4)
    b.set(ylabel="response time (s)", title="response time of every request (here)\nbox: quartiles and median")
    fig.legend(handles=[Patch(color="tab:red", label="waiting"), Patch(color="tab:blue", label="service"),
                        Line2D([], [], color="black", marker="_", ms=10, label="95 % interval of the mean response"),
                        Line2D([], [], ls="", marker="o", ms=4, color="tab:blue", alpha=0.6, label="one request")],
               loc="outside upper center", ncol=4, frameon=False)
    return fig


def plot(path: Path, stats: dict[str, dict[str, float]], results: dict[str, ReplayResult]) -> Path:
    """Draw :func:`table1_figure` to ``path``."""
    from petals_chain.experiments.common import save_figure

    return save_figure(table1_figure(stats, results), path)


def _read_saved(out_dir: Path, stem: str) -> tuple[dict[str, Any], dict[str, list], dict[str, list]]:
    """STEM_details.json, the request records per method (STEM_requests.csv) and the in-flight samples per method
    (STEM_samples.csv) of a finished replay."""
    saved = json.loads((out_dir / f"{stem}_details.json").read_text())
    kinds = {f.name: f.type for f in RequestRecord.__dataclass_fields__.values()}
    casts = {"int": int, "float": float, "str": str, "bool": lambda v: v == "True"}
    records: dict[str, list] = {}
    with (out_dir / f"{stem}_requests.csv").open() as fh:
        for row in csv.DictReader(fh):
            rec = RequestRecord(**{k: casts[str(kinds[k])](v) for k, v in row.items()})
            records.setdefault(rec.method, []).append(rec)
    samples: dict[str, list] = {}
    with (out_dir / f"{stem}_samples.csv").open() as fh:
        for row in csv.DictReader(fh):
            samples.setdefault(row["method"], []).append((float(row["time_s"]), float(row["in_flight"])))
    return saved, records, samples


def limit_checks(infos: dict[str, dict[str, Any]], results: dict[str, ReplayResult]) -> dict[str, LimitCheck]:
    """The distance-to-the-limit check of every replayed method that has one, with the 95 % interval of its mean
    response from its records (outputs written before the interval was kept lack it)."""
    out = {}
    for m in METHOD_ORDER:
        if m in infos and infos[m].get("limit"):
            check = LimitCheck(**infos[m]["limit"])
            if m in results and not math.isfinite(check.measured_ci95_half_s):
                finite = [r.response_s for r in results[m].records if math.isfinite(r.response_s)]
                check = replace(check, measured_ci95_half_s=mean_ci(finite)[1], requests=len(finite))
            out[METHODS[m].label] = check
    return out


LIMIT_TITLE = "measured mean response vs the Theorem 3.7 bounds of the measured chains"


def load_saved(out_dir: Path, stem: str = "table1") -> tuple[dict, dict[str, ReplayResult], dict]:
    """``(stats, results, infos)`` of every method in a finished replay's saved outputs, whatever its plan."""
    from petals_chain.experiments.replay import summarize

    saved, records, samples = _read_saved(out_dir, stem)
    infos = saved.get("infos", {})
    results = {m: ReplayResult(m, recs, np.asarray(samples.get(m, []), dtype=float).reshape(-1, 2),
                               infos.get(m, {}).get("wall_s", max(r.end_s for r in recs)))
               for m, recs in records.items()}
    return {m: summarize(recs) for m, recs in records.items()}, results, infos


def replot(out_dir: Path, stem: str = "table1") -> list[Path]:
    """STEM.png and STEM_limit.png again from a finished replay's saved outputs, nothing else rewritten."""
    stats, results, infos = load_saved(out_dir, stem)
    paths = [plot(out_dir / f"{stem}.png", stats, results)]
    limits = limit_checks(infos, results)
    if limits:
        paths.append(plot_limits(out_dir / f"{stem}_limit.png", limits, LIMIT_TITLE))
    return paths


def load_finished(out_dir: Path, stem: str, plan: ReplayPlan,
                  rerun: Collection[str] = ()) -> tuple[dict, dict, dict]:
    """The methods a previous run of the same plan already replayed (``--resume``), read back from its outputs:
    ``(stats, results, infos)``; empty when there is none, and an error when the outputs belong to another plan.
    Methods in ``rerun`` are left out, so that they are replayed again (the others' records stay as they were)."""
    from petals_chain.experiments.replay import summarize
    from petals_chain.model import SpecError

    details = out_dir / f"{stem}_details.json"
    if not details.exists():
        return {}, {}, {}
    saved, records, samples = _read_saved(out_dir, stem)
    if saved.get("plan") != list(plan.describe()):
        raise SpecError(f"--resume: {details} was written for another replay plan ({saved.get('plan', ['?'])[0]}); "
                        "use another --stem or drop --resume")
    stats, results, infos = {}, {}, {}
    for m, info in saved.get("infos", {}).items():
        if not str(info.get("status", "")).startswith("ran") or m not in records or m in rerun:
            continue
        recs = records[m]
        wall = info.get("wall_s", max(r.end_s for r in recs))
        results[m] = ReplayResult(m, recs, np.asarray(samples.get(m, []), dtype=float).reshape(-1, 2), wall)
        stats[m] = summarize(recs)
        infos[m] = info
    return stats, results, infos
