"""``python -m petals_chain.launch.dht_node --host H``: the DHT bootstrap node PETALS' servers and client meet in.

PETALS has no orchestrator to run its DHT, so :meth:`~petals_chain.launch.swarm_procs.TestbedSwarm.start_dht`
starts this in the root namespace; it prints ``ready MADDRS`` and serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence


def run_dht(host: str) -> int:
    """A DHT bootstrap node on ``host``: prints 'ready MADDRS', serves until SIGTERM/SIGINT."""
    from petals_chain.orchestrator.dht import start_dht

    dht = start_dht([], [f"/ip4/{host}/tcp/0"])
    print(f"ready {' '.join(dht.visible_maddrs)}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    dht.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``--host`` and run the node."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.launch.dht_node", description=__doc__.splitlines()[0])
    p.add_argument("--host", required=True, help="IPv4 address to listen on (a free TCP port is picked)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run_dht(args.host)


if __name__ == "__main__":
    sys.exit(main())
