"""Run one experiment (or `all`) and record it in the results folder."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from petals_chain.data import DATA_ENV, DataDirError, set_data_dir
from petals_chain.experiments import EXPERIMENTS, load
from petals_chain.experiments.common import REPO, publish
from petals_chain.model import SpecError
from petals_chain.sim.montecarlo import RayBackendError, add_ray_option, connect_ray


def grid_cell(text: str) -> tuple[int, float]:
    """A (J, η) grid cell written J:ETA, e.g. 10:0.4."""
    try:
        j, eta = text.split(":")
        return int(j), float(eta)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a cell is J:ETA, e.g. 10:0.4") from None


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the experiments asked for, print each summary."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.experiments", description=__doc__)
    p.add_argument("names", nargs="+", help=f"experiments to run: {', '.join(EXPERIMENTS)} or all")
    p.add_argument("--quick", action="store_true", help="a minutes-long version with fewer points and runs")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=REPO / "results", help="output folder (default: results/)")
    p.add_argument("--replot", action="store_true",
                   help="redraw the PNG (and README section) from the saved CSV without simulating (the experiments "
                        "that can: see the error for any other)")
    p.add_argument("--workers", type=int, default=None, help="parallel processes for Monte Carlo runs (with --ray: "
                   "replications in flight at once, default: as many as the cluster schedules)")
    add_ray_option(p)
    p.add_argument("--cells", type=grid_cell, nargs="+", default=None, metavar="J:ETA",
                   help="fig8: only these (J, η) cells of its grid (e.g. 10:0.4), with the seeds they have in the "
                        "whole grid; written to fig8_cell_check.csv, leaving fig8's own results as they are")
    p.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   help="fig8: recompute only these methods' columns of the saved fig8_runs.csv (same seeds) and "
                        "redraw; for a change that touches these methods alone")
    p.add_argument("--data-dir", type=Path, default=None,
                   help=f"folder with the Azure traces and the RIPE Atlas file (default: ${DATA_ENV})")
    args = p.parse_args(argv)
    try:
        set_data_dir(args.data_dir)
    except DataDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    names = list(EXPERIMENTS) if args.names == ["all"] else args.names
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        print(f"error: unknown experiment(s) {unknown}; known: {', '.join(EXPERIMENTS)}", file=sys.stderr)
        return 2
    cannot = [n for n in names if args.replot and not getattr(load(n), "REPLOT", False)]
    if cannot:
        can = [n for n in EXPERIMENTS if getattr(load(n), "REPLOT", False)]
        print(f"error: --replot: {', '.join(cannot)} cannot redraw from saved results ({', '.join(can)} can)",
              file=sys.stderr)
        return 2
    if (args.cells or args.methods) and names != ["fig8"]:
        print("error: --cells and --methods are fig8's; run them with fig8 alone", file=sys.stderr)
        return 2
    if args.cells and args.methods:
        print("error: --cells runs every method in its cells; --methods reruns some methods in every cell",
              file=sys.stderr)
        return 2
    if args.ray:  # join the cluster before any work, so that a wrong address costs nothing
        try:
            connect_ray(args.ray)
        except RayBackendError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        t0 = time.perf_counter()
        try:
            summary = load(name).run(args)
        except (FileNotFoundError, SpecError) as exc:  # missing data file, bad cluster: one line, nothing written
            print(f"error: {name}: {exc}", file=sys.stderr)
            return 2
        publish(args.out, summary, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
