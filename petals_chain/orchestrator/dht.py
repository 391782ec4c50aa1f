"""Start or join the hivemind DHT that PETALS servers and clients of one swarm meet in.

The orchestrator calls ``start_dht`` (``--start-dht`` / ``--initial-peers``) so that a
swarm needs no separate bootstrap process: servers and clients then learn the DHT's
multiaddrs and the model's DHT prefix from the orchestrator's ``/health``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from petals_chain.protocol.dht_prefix import check_maddrs

LOOPBACK_MADDR = "/ip4/127.0.0.1/tcp/0"


class DHTStartError(ConnectionError):
    """The DHT node could not start or could not reach its initial peers."""


@dataclass
class DHTHandle:
    """A running DHT node (a child process plus its p2pd) and the multiaddrs others can join it by."""

    dht: Any
    visible_maddrs: list[str]

    def shutdown(self) -> None:
        """Stop the node and its p2pd."""
        self.dht.shutdown()


def start_dht(
    initial_peers: Sequence[str] = (),
    host_maddrs: Sequence[str] = (LOOPBACK_MADDR,),
    identity_path: str | None = None,
) -> DHTHandle:
    """Start a DHT node; with ``initial_peers`` it joins that swarm, without it it starts a new one."""
    from hivemind.dht import DHT

    peers = check_maddrs(initial_peers, "--initial-peers")
    hosts = check_maddrs(host_maddrs, "--dht-host-maddrs")
    try:
        dht = DHT(
            start=True,
            initial_peers=peers,
            host_maddrs=hosts,
            identity_path=identity_path,
            use_relay=False,
            use_auto_relay=False,
        )
    except Exception as exc:  # hivemind reports a bad or unreachable peer as P2PDaemonError and the like
        what = f"join the DHT at {' '.join(peers)}" if peers else "start a DHT node"
        raise DHTStartError(f"cannot {what}: {exc}") from None
    maddrs = [str(m) for m in dht.get_visible_maddrs()]
    return DHTHandle(dht, maddrs)

