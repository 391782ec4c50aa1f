"""The human-readable plan of a testbed: servers, MIG commands or CPU emulation, namespaces, delays, trace."""

from __future__ import annotations

from petals_chain.launch import latency, mig, netns
from petals_chain.launch.commands import show
from petals_chain.launch.testbed import Testbed


def _servers(tb: Testbed) -> list[str]:
    """One line per server: where it runs, its memory (and how many blocks that is), speed and RTT."""
    lines = [f"  {'name':<8} {'where':<28} {'memory':>10} {'blocks fit':>10} {'speed':>6} {'RTT':>9}"]
    for s in tb.servers:
        where = f"GPU {s.gpu_index} MIG {s.profile} @slice {s.placement}" if s.kind == "mig" else "CPU process"
        lines.append(f"  {s.name:<8} {where:<28} {s.memory_bytes / 1e9:>8.3f}GB "
                     f"{s.memory_bytes / tb.model.block_bytes:>10.1f} {s.speed_factor:>6.3f} {s.rtt_s * 1e3:>7.2f}ms")
    return lines


def describe(tb: Testbed, *, tag: str = "TAG", method: str | None = None, detection: str = "",
             mig_plan: mig.MigPlan | None = None, mig_note: str = "") -> str:
    """The full plan as text; ``method`` None means the delay method was not detected (shown for both)."""
    m = tb.model
    rtt_from = "RIPE Atlas, seed %d" % tb.seed if tb.latency_source == "ripe_atlas" else "explicit"
    lines = [f"testbed {tb.name}" + (f" ({tb.source})" if tb.source else ""),
             f"model {m.name}: {m.num_blocks} blocks × {m.block_bytes / 1e6:.3f} MB, "
             f"cache {m.cache_bytes / 1e6:.3f} MB per block per job" + (f", from {tb.model_path}" if tb.model_path
                                                                        else ""),
             f"servers ({len(tb.servers)}; RTTs client <-> server, {rtt_from}):", *_servers(tb)]
    if tb.is_mig:
        lines.append(f"MIG ({mig_note or ('checked on this host' if mig_plan and mig_plan.detected else 'plan')}):")
        if mig_plan is not None:
            lines += ["  " + x for x in mig.format_plan(mig_plan).splitlines()]
        lines.append("  each server runs with CUDA_VISIBLE_DEVICES=<its MIG-... UUID, read back after setup>")
    else:
        lines.append("CPU emulation: each server is a CPU process whose memory budget and speed factor stand in for a "
                     "MIG slice (petals_chain.launch.emulate); CUDA_VISIBLE_DEVICES is empty")
    shown = method or "relay"
    eps = netns.plan_endpoints(tb, tag, shown)
    lines.append(f"network: subnet {tb.subnet}, one namespace + veth pair (/30) per server, port {tb.port}")
    for ep in eps:
        lines.append(f"  {ep.name:<8} netns {ep.netns:<14} veth {ep.root_link}<->{ep.ns_link}  "
                     f"gateway {ep.gateway}  address {ep.address}:{ep.port}")
    if method is None:
        lines.append(f"delays: method not detected ({detection or 'needs root'}); "
                     f"netem where the kernel has it, else user-space relays")
    else:
        lines.append(f"delays: {method} ({detection})" if detection else f"delays: {method}")
    for ep in eps:
        if method == "netem":
            lines += [f"  {show(c)}" for c in latency.netem_commands(ep)]
        else:
            lines.append(f"  {ep.name}: relay {ep.address}:{ep.port} -> {netns.LOOPBACK}:{ep.port}, "
                         f"{ep.one_way_delay_s * 1e3:.3f} ms each way (server binds {netns.LOOPBACK}:{ep.port})")
    if tb.trace is not None:
        n = f"first {tb.trace.requests} requests" if tb.trace.requests else "all requests"
        lines.append(f"trace: {tb.trace.path} ({n})")
    for w in tb.warnings():
        lines.append(f"warning: {w}")
    return "\n".join(lines)
