"""Command line: `python -m petals_chain compose CLUSTER.yaml [--method M] [--c N | --tune ...] [--json]` and
`python -m petals_chain moldable optimal|simulate ...` (petals_chain/moldable/cli.py)."""

from __future__ import annotations

import argparse
import json
import sys

from petals_chain.cli_args import OneLineParser, positive_int_arg
from petals_chain.model import InfeasibleError, SpecError


def _compose(args: argparse.Namespace) -> int:
    from petals_chain.compose.cluster_file import load_cluster
    from petals_chain.compose.report import composition_table, composition_to_dict
    from petals_chain.compose.method_table import METHODS, Routing, get_method

    if args.method in METHODS and METHODS[args.method].routing is not Routing.JFFC:
        raise SpecError(f"--method: {args.method} routes requests without fixed chains, so compose has nothing to "
                        f"show; choose one of {', '.join(_chain_methods())}")
    method = get_method(args.method, choices=_chain_methods(), field="--method")
    cluster = load_cluster(args.cluster)
    comp = method.compose(
        cluster.servers, cluster.model, cluster.load.arrival_rate, cluster.load.target_load, c=args.c, tune=args.tune
    )
    if args.json:
        doc = composition_to_dict(comp, cluster.load.arrival_rate, cluster.load.target_load)
        print(json.dumps(doc, indent=2, allow_nan=False))
    else:
        print(composition_table(comp, cluster.load.arrival_rate, cluster.load.target_load))
    return 0


def _chain_methods() -> tuple[str, ...]:
    """Methods with fixed chains (those compose can print)."""
    from petals_chain.compose.method_table import METHODS, Routing

    return tuple(n for n, m in METHODS.items() if m.routing is Routing.JFFC)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and --help)."""
    p = OneLineParser(prog="python -m petals_chain", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compose", help="place blocks, compose chains and tune c for a cluster file")
    c.add_argument("cluster", help="cluster description (.yaml or .json); see README")
    c.add_argument("--method", default="proposed", metavar="METHOD",
                   help="composition: proposed (default: c and chains by the bounds and the estimated mean), paper "
                        "(Algorithm 1 as written), max-chains (every chain the servers allow), jffc_only "
                        "(whole-model servers)")
    g = c.add_mutually_exclusive_group()
    g.add_argument("--c", type=positive_int_arg, default=None,
                   help="use this reserved concurrency c (an integer >= 1) instead of tuning it")
    g.add_argument("--tune", choices=("lower", "upper", "surrogate"), default="lower",
                   help="criterion that picks c (default: the Theorem 3.7 lower bound; for proposed, the bounds and "
                        "the estimated mean)")
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
