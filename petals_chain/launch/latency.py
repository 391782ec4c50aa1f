"""Emulated network delay between the client and each server: kernel ``tc netem`` where it exists, else a relay.

``netem``: a ``netem delay RTT/2`` qdisc on both ends of the server's veth pair, so a round trip
between the root namespace (client, orchestrator, DHT bootstrap) and server j takes RTT_j more;
between servers i and j it takes RTT_i + RTT_j. ``relay`` (kernels without ``sch_netem``, like
this machine's): the server listens on loopback inside its namespace and a
:mod:`petals_chain.launch.relay` on the namespace's address adds RTT/2 to each direction, so
anything reaching server j through the address the swarm knows sees RTT_j more (also from
other servers: there only the destination's relay is on the path). Which one runs is detected
(:func:`detect_netem`), printed, and the achieved RTTs are measured with
:mod:`petals_chain.launch.echo`, never assumed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from petals_chain.launch.commands import run
from petals_chain.launch.netns import Endpoint

DEFAULT_TOLERANCE_S = 0.003  # "within a few ms": absolute slack ...
DEFAULT_TOLERANCE_REL = 0.05  # ... or 5 % of the configured RTT, whichever is larger


class DelayMethodError(RuntimeError):
    """The requested delay method cannot be used on this host (e.g. netem asked for, kernel lacks it)."""


@dataclass(frozen=True)
class NetemProbe:
    """Whether ``tc qdisc add ... netem`` works here, and what tc said."""

    available: bool
    detail: str


def detect_netem(probe_ns: str) -> NetemProbe:
    """Try ``tc qdisc add dev lo root netem delay 1ms`` in a throwaway namespace ``probe_ns``, then remove it.

    The caller registers ``probe_ns`` for teardown before calling. Raises RuntimeError when
    namespaces cannot be made at all (not root): nothing can be emulated then.
    """
    made = run(["ip", "netns", "add", probe_ns], check=False)
    if made.returncode != 0:
        raise RuntimeError(f"cannot create a network namespace (root needed): {(made.stderr or '').strip()}")
    try:
        tried = run(["ip", "netns", "exec", probe_ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                     "delay", "1ms"], check=False)
        if tried.returncode == 0:
            return NetemProbe(True, "tc netem works in a network namespace")
        said = " ".join((tried.stderr or tried.stdout or "").split())
        return NetemProbe(False, f"tc netem unavailable ({said or f'exit {tried.returncode}'})")
    finally:
        run(["ip", "netns", "del", probe_ns], check=False)


def choose_method(requested: str, probe: NetemProbe) -> str:
    """The delay method to use: netem if available and not overridden, else relay; error if netem is forced."""
    if requested == "relay":
        return "relay"
    if probe.available:
        return "netem"
    if requested == "netem":
        raise DelayMethodError(f"latency.method is 'netem' but {probe.detail}; use 'auto' or 'relay'")
    return "relay"


def _tc_delay(seconds: float) -> str:
    """A tc time argument in whole microseconds."""
    return f"{round(seconds * 1e6)}us"


def netem_commands(ep: Endpoint) -> list[list[str]]:
    """The tc commands that delay both directions of server ``ep``'s veth pair by RTT/2 (none for RTT 0)."""
    if ep.one_way_delay_s <= 0:
        return []
    d = _tc_delay(ep.one_way_delay_s)
    return [["tc", "qdisc", "replace", "dev", ep.root_link, "root", "netem", "delay", d],
            ["ip", "netns", "exec", ep.netns, "tc", "qdisc", "replace", "dev", ep.ns_link, "root", "netem",
             "delay", d]]


def relay_args(ep: Endpoint) -> list[str]:
    """Arguments of :mod:`petals_chain.launch.relay` for server ``ep`` (swarm address → loopback)."""
    return ["--listen", f"{ep.address}:{ep.port}", "--target", f"{ep.listen_host}:{ep.port}",
            "--delay-ms", f"{ep.one_way_delay_s * 1e3:.6f}"]


def expected_rtt_s(dst: Endpoint, src: Endpoint | None = None) -> float:
    """The RTT the emulation should add from ``src`` (None: the root namespace) to server ``dst``."""
    if src is None or dst.method == "relay":
        return dst.rtt_s
    return dst.rtt_s + src.rtt_s


@dataclass(frozen=True)
class RttResult:
    """Configured vs measured round trips from ``source`` to one server (seconds)."""

    server: str
    source: str
    expected_s: float
    median_s: float
    min_s: float
    max_s: float
    samples: int
    tolerance_s: float

    @property
    def error_s(self) -> float:
        """Measured median minus expected."""
        return self.median_s - self.expected_s

    @property
    def ok(self) -> bool:
        """Whether the median is within the tolerance of the expected RTT."""
        return abs(self.error_s) <= self.tolerance_s


def tolerance_s(expected_s: float, abs_s: float = DEFAULT_TOLERANCE_S, rel: float = DEFAULT_TOLERANCE_REL) -> float:
    """Allowed |median - expected|: ``abs_s`` or ``rel`` of the expected RTT, whichever is larger."""
    return max(abs_s, rel * expected_s)


def summarize(server: str, source: str, expected_s: float, rtts_s: list[float]) -> RttResult:
    """An RttResult from raw round-trip samples."""
    if not rtts_s:
        raise ValueError(f"no RTT samples from {source} to {server}")
    return RttResult(server, source, expected_s, statistics.median(rtts_s), min(rtts_s), max(rtts_s), len(rtts_s),
                     tolerance_s(expected_s))


def format_results(results: list[RttResult], method: str) -> str:
    """A table of configured vs measured RTTs (ms) with the delay method named."""
    lines = [f"delay method: {method}",
             f"{'server':<10} {'from':<10} {'configured':>11} {'median':>9} {'min':>8} {'max':>8} {'error':>8}  ok"]
    for r in results:
        lines.append(f"{r.server:<10} {r.source:<10} {r.expected_s * 1e3:>9.2f}ms {r.median_s * 1e3:>7.2f}ms "
                     f"{r.min_s * 1e3:>6.2f}ms {r.max_s * 1e3:>6.2f}ms {r.error_s * 1e3:>+6.2f}ms  "
                     f"{'yes' if r.ok else 'NO'}")
    return "\n".join(lines)
