"""``python -m petals_chain.bench <subcommand> [options]``: run one benchmark and print its figures."""

from __future__ import annotations

import sys

from petals_chain.bench import SUBCOMMANDS, load


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the subcommand's ``run``; exit code 2 with a one-line message for a bad subcommand."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m petals_chain.bench {{{','.join(SUBCOMMANDS)}}} [options]")
        return 0 if argv else 2
    try:
        run = load(argv[0])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
