"""Command line: `python -m petals_chain compose CLUSTER.yaml [--c N | --tune ...] [--json]` and
`python -m petals_chain moldable optimal|simulate ...` (petals_chain/moldable/cli.py)."""

from __future__ import annotations

import argparse
import json
import sys

from petals_chain.cli_args import OneLineParser, positive_int_arg
from petals_chain.model import InfeasibleError, SpecError


def _compose(args: argparse.Namespace) -> int:
    from petals_chain.compose.cluster import load_cluster
    from petals_chain.compose.report import composition_table, composition_to_dict
    from petals_chain.compose.tuning import compose

    cluster = load_cluster(args.cluster)
    comp = compose(
        cluster.servers, cluster.model, cluster.load.arrival_rate, cluster.load.target_load, c=args.c, tune=args.tune
    )
    if args.json:
        doc = composition_to_dict(comp, cluster.load.arrival_rate, cluster.load.target_load)
        print(json.dumps(doc, indent=2, allow_nan=False))
    else:
        print(composition_table(comp, cluster.load.arrival_rate, cluster.load.target_load))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and --help)."""
    p = OneLineParser(prog="python -m petals_chain", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compose", help="place blocks, compose chains and tune c for a cluster file")
    c.add_argument("cluster", help="cluster description (.yaml or .json); see README")
    g = c.add_mutually_exclusive_group()
    g.add_argument("--c", type=positive_int_arg, default=None,
                   help="use this reserved concurrency c (an integer >= 1) instead of tuning it")
    g.add_argument("--tune", choices=("lower", "upper", "surrogate"), default="lower",
                   help="criterion that picks c (default: the Theorem 3.7 lower bound)")
    c.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    c.set_defaults(func=_compose)
    from petals_chain.moldable.cli import add_parser as add_moldable

    add_moldable(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point: bad input becomes one line on stderr and exit code 2."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (SpecError, InfeasibleError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
