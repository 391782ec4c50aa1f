"""Mell, live: downtime of moving a running SmolLM2 session between chains by KV transfer vs token replay.

Runs experiments/mell_live.py's measurement on a loopback swarm (three CPU servers: one chain of one server, one of
two) and again under a ``tc tbf`` bandwidth cap, then compares each length's faster mode with the mode Mell's
adaptive division picks from the measured bandwidth and prefill rate (first fit, best fit, and the fastest rule
with each link's profile from its shortest and longest session). ``--quick``: 128 and 512 tokens only.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from petals_chain.experiments import mell_live
from petals_chain.experiments.common import Summary, plt, read_csv, replotting, write_csv

REPLOT = True  # --replot redraws the PNG and section from results/mell_downtime.csv
CAP_MBIT = 10.0  # near where token replay on these CPU servers starts to beat KV transfer (SmolLM2 fp32)
QUICK_LENGTHS = (128, 512)


def command(args) -> str:
    """The command line that reproduces this run."""
    return "python -m petals_chain.experiments mell-downtime" + (" --quick" if args.quick else "") + \
        f" --seed {args.seed}"


def _plot(rows: list[dict], path: Path) -> None:
    """Downtime against session length, one line per link and mode."""
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(7, 4))
    for link in sorted({r["link"] for r in rows}):
        for mode, style in (("kv", "-o"), ("replay", "--s")):
            pts = sorted((int(r["tokens"]), float(r["downtime_s"])) for r in rows
                         if r["link"] == link and r["mode"] == mode)
            if pts:
                ax.plot(*zip(*pts), style, label=f"{'KV transfer' if mode == 'kv' else 'token replay'}, {link}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("session length (tokens)")
    ax.set_ylabel("downtime: extra inter-token gap (s)")
    ax.set_title("Live migration between chains, SmolLM2-135M on CPU servers")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)


def run(args) -> Summary:
    """Measure (or, with --replot, redraw), write results/mell_downtime.{csv,png} and the headline lines."""
    out: Path = args.out
    csv_path, png_path = out / "mell_downtime.csv", out / "mell_downtime.png"
    if replotting(args):
        rows = read_csv(csv_path)
    else:
        lengths = QUICK_LENGTHS if args.quick else mell_live.LENGTHS
        log_dir = Path(tempfile.mkdtemp(prefix="mell-downtime-"))  # the swarm's logs, kept for a look afterwards
        print(f"swarm logs: {log_dir}")
        found = mell_live.measure(lengths, "loopback", log_dir / "loopback", args.seed)
        if os.geteuid() == 0:
            found += mell_live.measure_capped(lengths, CAP_MBIT, log_dir / "capped", args.seed)
        rows = [asdict(r) for r in found]
        write_csv(csv_path, rows)
    _plot(rows, png_path)
    typed = [mell_live.DowntimeRow(r["link"], int(r["tokens"]), int(r["position"]), r["mode"], r["direction"],
                                   float(r["migrate_s"]), float(r["gap_s"]), float(r["normal_gap_s"]),
                                   float(r["downtime_s"]), float(r["freed_s"]), int(r["kv_bytes"])) for r in rows]
    checks = mell_live.division_check(typed)
    write_csv(out / "mell_downtime_division.csv", [{k: v for k, v in c.items() if k != "profile"} for c in checks])
    lines = []
    for c in checks:
        lines.append(f"{c['link']}, {c['tokens']} tokens: KV transfer {c['kv_downtime_s']:.2f} s (estimate "
                     f"{c['kv_estimate_s']:.2f}), token replay {c['replay_downtime_s']:.2f} s (estimate "
                     f"{c['replay_estimate_s']:.2f}), faster: {c['faster']}; the division picks "
                     f"{c['first_fit']} / {c['best_fit']} / {c['fastest']} (first / best fit / fastest, simulator's "
                     f"epoch limits), {c['first_fit_both']} / {c['best_fit_both']} / {c['fastest_both']} with an "
                     "epoch both modes fit in")
    freed = max(r.freed_s for r in typed)
    lines.append(f"old servers' cache free at most {freed * 1000:.0f} ms after a migration returned "
                 "(petals' own cache accounting, rpc_info)")
    n = len(checks)
    deferred = sum(c["first_fit"] == "defer" for c in checks)
    profile = ", ".join(f"{link}: {c['bandwidth_MBps']:.1f} MB/s, {c['prefill_tok_s']:.0f} tok/s"
                        for link, c in {c["link"]: c for c in checks}.items())
    lines.append(f"measured profile ({profile}); with the simulator's limits (2 s of link, 0.5 s of prefill per "
                 f"epoch) {deferred} of {n} moves fit neither budget and are deferred")
    ff = sum(c["first_fit_both"] == c["faster"] for c in checks)
    bf = sum(c["best_fit_both"] == c["faster"] for c in checks)
    fa = sum(c["fastest_both"] == c["faster"] for c in checks)
    lines.append(f"when both modes fit, first fit picks the faster mode in {ff} of {n} cases (it always tries KV "
                 f"first), best fit in {bf} of {n} (it leaves the least slack, i.e. takes the slower mode), and the "
                 f"fastest rule (ours) in {fa} of {n}")
    fits = ", ".join(f"{link}: {p['link_MBps']:.2f} MB/s + {p['kv_setup_s']:.2f} s setup, {p['prefill_tok_s']:.1f} "
                     f"tok/s doubling at {p['prefill_doubling_tokens']:.0f} tokens"
                     for link, p in {c["link"]: c["profile"] for c in checks}.items())
    lines.append(f"fastest rule's profile per link, from its 128- and 2048-token runs ({fits}); the 512- and "
                 "1024-token cases are out of sample")
    ends = {min(c["tokens"] for c in checks), max(c["tokens"] for c in checks)}  # the lengths the profile is fitted on
    held = [c for c in checks if c["tokens"] not in ends]
    if held:
        lines.append(f"scored on the held-out lengths alone, the fastest rule picks the faster mode in "
                     f"{sum(c['fastest_both'] == c['faster'] for c in held)} of {len(held)} cases, first fit in "
                     f"{sum(c['first_fit_both'] == c['faster'] for c in held)}, best fit in "
                     f"{sum(c['best_fit_both'] == c['faster'] for c in held)}")
    return Summary("mell_downtime", "Mell live: migration downtime, KV transfer vs token replay", command(args), lines,
                   ["the paper divides moves between KV transfer and token replay within link and compute budgets; "
                    "it reports no live downtime figures"], {"division": checks})
