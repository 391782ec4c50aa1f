"""One network namespace per server, joined to the root namespace by a veth pair with its own /30.

Server j (0-based) gets the (j+1)-th /30 of the testbed subnet: the root end of its veth pair
has the first address (its gateway), the namespace end the second (the address the swarm
reaches it at). Namespaces get a route to the testbed subnet only, so nothing in them can
reach any other network. Forwarding is enabled on our root-side veth ends only (a per-interface
sysctl that disappears with the link; the host-wide ``ip_forward`` is left alone), which lets
servers reach one another through the root namespace. Services of the root namespace (DHT
bootstrap, orchestrator, clients) are reachable from every namespace at any gateway address.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from petals_chain.launch import state
from petals_chain.launch.testbed import Testbed

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Endpoint:
    """Where server ``index`` lives: its namespace, veth ends, addresses, port and configured RTT."""

    index: int
    name: str
    netns: str
    root_link: str
    ns_link: str
    gateway: str  # root end of the pair: how the namespace reaches the root namespace
    address: str  # namespace end: the address the swarm is told (host_maddrs / announce_maddrs)
    port: int
    rtt_s: float
    method: str  # "netem" or "relay"

    @property
    def listen_host(self) -> str:
        """Where the server itself binds: its own address (netem), or loopback behind the relay (relay)."""
        return self.address if self.method == "netem" else LOOPBACK

    @property
    def one_way_delay_s(self) -> float:
        """Delay added to each direction: half the configured RTT."""
        return self.rtt_s / 2


def pair_addresses(subnet: ipaddress.IPv4Network, j: int) -> tuple[str, str]:
    """(gateway, address) of server j: the first two hosts of the (j+1)-th /30 of ``subnet``."""
    base = int(subnet.network_address) + 4 * (j + 1)
    if base + 3 > int(subnet.broadcast_address):
        raise ValueError(f"subnet {subnet} has no /30 left for server {j}")
    return str(ipaddress.IPv4Address(base + 1)), str(ipaddress.IPv4Address(base + 2))


def plan_endpoints(testbed: Testbed, tag: str, method: str) -> list[Endpoint]:
    """The endpoint of every server of ``testbed`` for a launch tagged ``tag`` using delay ``method``."""
    out = []
    for j, srv in enumerate(testbed.servers):
        gw, addr = pair_addresses(testbed.subnet, j)
        out.append(Endpoint(j, srv.name, state.ns_name(tag, j), state.root_link(tag, j), state.ns_link(tag, j),
                            gw, addr, testbed.port, srv.rtt_s, method))
    return out


def setup_commands(ep: Endpoint, subnet: ipaddress.IPv4Network) -> list[list[str]]:
    """The ip/sysctl commands that create server ``ep``'s namespace and veth pair, in order."""
    return [
        ["ip", "netns", "add", ep.netns],
        ["ip", "link", "add", ep.root_link, "type", "veth", "peer", "name", ep.ns_link, "netns", ep.netns],
        ["ip", "addr", "add", f"{ep.gateway}/30", "dev", ep.root_link],
        ["sysctl", "-q", "-w", f"net.ipv4.conf.{ep.root_link}.forwarding=1"],
        ["ip", "link", "set", ep.root_link, "up"],
        ["ip", "-n", ep.netns, "link", "set", "lo", "up"],
        ["ip", "-n", ep.netns, "addr", "add", f"{ep.address}/30", "dev", ep.ns_link],
        ["ip", "-n", ep.netns, "link", "set", ep.ns_link, "up"],
        ["ip", "-n", ep.netns, "route", "add", str(subnet), "via", ep.gateway],
    ]


def teardown_commands(ep: Endpoint) -> list[list[str]]:
    """The commands that remove what :func:`setup_commands` made (deleting one veth end removes both)."""
    return [["ip", "link", "del", ep.root_link], ["ip", "netns", "del", ep.netns]]


def host_conflicts(subnet: ipaddress.IPv4Network, addresses: list[str]) -> list[str]:
    """Addresses already configured on this host that fall inside ``subnet`` (we must not collide with them)."""
    inside = []
    for a in addresses:
        try:
            if ipaddress.IPv4Interface(a).ip in subnet:
                inside.append(a)
        except ValueError:
            continue
    return inside
