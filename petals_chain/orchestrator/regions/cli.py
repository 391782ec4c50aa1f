"""``python -m petals_chain.orchestrator.regions``: run the region-aware orchestrator (one per region + TORTA).

Each region named by ``--regions`` composes its own servers (they register under ``/regions/NAME``); clients lease
under ``/origins/ORIGIN`` (or POST /lease with ``origin``/``rtt_s``); ``--policy`` (torta, torta-ppo, skylb, rr) routes
each request to a region, the TORTA plan being recomputed every ``--slot`` from the regions' queues and the origins'
arrivals; torta-ppo routes by that plan refined by a PPO policy checkpoint (``--ppo-checkpoint``). Bad arguments:
one line, exit 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from petals_chain import defaults
from petals_chain.cli_args import (
    OneLineParser,
    add_token_option,
    duration_range,
    fraction_arg,
    port_arg,
    positive_float_arg,
    positive_int_arg,
    token_files,
    warn_token_flags,
    size_range,
)
from petals_chain.compose.method_table import METHODS
from petals_chain.model import ModelSpec, SpecError
from petals_chain.orchestrator.cli import TOKEN_ENV, run_service
from petals_chain.orchestrator.engine.composition import CompositionPolicy
from petals_chain.orchestrator.leasing.managers import dispatch_manager
from petals_chain.orchestrator.leasing.policies import LEASE_POLICIES
from petals_chain.orchestrator.state.registry import Registry
from petals_chain.torta.regional import POLICIES, RegionalMacro, RegionError


def latency_matrix(text: str, regions: int) -> np.ndarray:
    """``"0,60,30;60,0,40;30,40,0"`` (ms, rows by ';') → seconds; RegionError naming --latency-ms otherwise."""
    try:
        rows = [[float(x) for x in row.split(",")] for row in text.split(";")]
        lat = np.array(rows, dtype=float) * 1e-3
    except ValueError:
        raise RegionError(f"--latency-ms: expected rows of numbers like '0,60;60,0', got {text!r}") from None
    if lat.shape != (regions, regions):
        raise RegionError(f"--latency-ms: needs {regions}×{regions} entries for --regions, got shape {lat.shape}")
    return lat


def anchor_map(text: str, names: Sequence[str]) -> dict[str, str]:
    """``"r0=http://10.0.0.1:8700/health,r1=..."`` → {region: URL}; RegionError naming --anchors otherwise."""
    out: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, url = item.partition("=")
        if not sep or not url.startswith(("http://", "https://")):
            raise RegionError(f"--anchors: expected REGION=http://HOST:PORT/PATH items, got {item!r}")
        if name not in names:
            raise RegionError(f"--anchors: unknown region {name!r} (known: {', '.join(names)})")
        out[name] = url
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (sizes and durations with units, as the single orchestrator's)."""
    p = OneLineParser(prog="python -m petals_chain.orchestrator.regions", description=__doc__.splitlines()[0])
    p.add_argument("--regions", required=True, help="region names, comma-separated (e.g. eu,us,asia)")
    p.add_argument("--latency-ms", required=True, help="inter-region one-way latency matrix in ms, rows by ';'")
    p.add_argument("--policy", default="torta", choices=POLICIES, help="how requests are sent to regions")
    p.add_argument("--micro", default="jffc", choices=LEASE_POLICIES.names("dispatch"),
                   help="how a region picks a chain: JFFC (default) or the micro layer's greedy score")
    p.add_argument("--slot", "--slot-s", dest="slot_s", type=duration_range(gt=0), metavar="DURATION", default=5.0,
                   help="the macro layer's slot (default 5 s)")
    p.add_argument("--anchors", default="", help="per region, a URL in that region that servers started with "
                   "--region auto measure their round trip to, e.g. 'eu=http://10.0.0.5:8700/health,us=...' "
                   "(default: the front's /regions/NAME/health)")
    p.add_argument("--ppo-checkpoint", default=None, help="a PPO policy (python -m "
                   "petals_chain.experiments.torta_train) for as many regions, refining the OT plan")
    p.add_argument("--model-blocks", type=positive_int_arg, required=True)
    p.add_argument("--block-bytes", type=size_range(gt=0), metavar="SIZE", required=True)
    p.add_argument("--cache-bytes", type=size_range(gt=0), metavar="SIZE", required=True)
    p.add_argument("--model-name", default="model")
    p.add_argument("--arrival-rate", type=positive_float_arg, default=defaults.ARRIVAL_RATE,
                   help="λ each region's composition is sized for, requests/s")
    p.add_argument("--target-load", type=fraction_arg, default=defaults.TARGET_LOAD)
    p.add_argument("--c", type=positive_int_arg, default=None, help="fixed reserved concurrency c (default: tuned)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_arg, default=defaults.ORCHESTRATOR_PORT)
    add_token_option(p, "--token", f"shared bearer token (or env {TOKEN_ENV})")
    p.add_argument("--lease-ttl-s", type=duration_range(gt=0), default=defaults.LEASE_TTL_S)
    p.add_argument("--heartbeat-timeout-s", type=duration_range(ge=0), default=defaults.HEARTBEAT_TIMEOUT_S)
    p.add_argument("--start-dht", action="store_true", help="start a DHT node that every region's servers join")
    p.add_argument("--dht-host-maddrs", nargs="*", default=["/ip4/127.0.0.1/tcp/0"])
    p.add_argument("--log-level", default="INFO")
    return token_files(p.parse_args(argv), "--token")


def composition_policy(args: argparse.Namespace) -> CompositionPolicy:
    """How every region composes its servers: the default method (proposed) at --arrival-rate, --target-load, --c."""
    return CompositionPolicy(METHODS["proposed"].compose, arrival_rate=args.arrival_rate,
                             target_load=args.target_load, c=args.c)


def build(args: argparse.Namespace, *, dht_info: dict[str, Any] | None = None):  # -> RegionalOrchestrator (lazy)
    """The region orchestrators and the macro layer the arguments describe."""
    from petals_chain.orchestrator.engine.config import OrchestratorConfig
    from petals_chain.orchestrator.engine.core import Orchestrator
    from petals_chain.orchestrator.regions.front import RegionalOrchestrator

    names = [n.strip() for n in args.regions.split(",") if n.strip()]
    lat = latency_matrix(args.latency_ms, len(names))
    policy = None
    if args.ppo_checkpoint:
        from pathlib import Path

        import torch

        from petals_chain.torta.train import load_policy

        n = len(names)
        try:
            trained = int(torch.load(args.ppo_checkpoint, weights_only=True)["regions"])
        except Exception as exc:  # a missing, truncated or foreign file
            raise RegionError(f"--ppo-checkpoint: cannot read {args.ppo_checkpoint}: {exc}") from None
        if trained != n:
            raise RegionError(f"--ppo-checkpoint: trained for {trained} regions, --regions names {n}")
        policy = load_policy(Path(args.ppo_checkpoint), 3 * n + 3 + 2 * n * n).act
    macro = RegionalMacro(names, lat, slot_s=args.slot_s, policy=policy)
    model = ModelSpec(args.model_blocks, args.block_bytes, args.cache_bytes, args.model_name)
    composing = composition_policy(args)
    regions = {}
    for name in names:
        config = OrchestratorConfig(lease_ttl_s=args.lease_ttl_s, heartbeat_timeout_s=args.heartbeat_timeout_s or None,
                                    offer_when_serving=True, dht_info=dht_info)
        leases = dispatch_manager(args.micro)
        regions[name] = Orchestrator(Registry(model), config, composition_policy=composing, lease_manager=leases)
    return RegionalOrchestrator(regions, macro, policy=args.policy, anchors=anchor_map(args.anchors, names),
                                dht_info=dht_info)


async def _run(args: argparse.Namespace) -> None:
    """Build, start the DHT if asked, serve until a signal."""
    from petals_chain.orchestrator.http.api import serve
    from petals_chain.orchestrator.regions.api import build_regional_app

    dht = dht_info = None
    if args.start_dht:
        from petals_chain.orchestrator.dht import start_dht
        from petals_chain.protocol.dht_prefix import dht_prefix_for

        dht = start_dht([], args.dht_host_maddrs)
        dht_info = {"initial_peers": dht.visible_maddrs, "dht_prefix": dht_prefix_for(args.model_name)}
        print(f"dht listening on {' '.join(dht.visible_maddrs)}", flush=True)
    reg = build(args, dht_info=dht_info)

    def ready(host: str, port: int) -> None:
        """The line scripts wait for."""
        print(f"orchestrator listening on http://{host}:{port} (regions {', '.join(reg.names)}; policy "
              f"{reg.policy}; slot {reg.macro.slot_s:g} s)", flush=True)

    token = args.token or os.environ.get(TOKEN_ENV) or None
    try:
        await serve(build_regional_app(reg, token=token), args.host, args.port, on_ready=ready)
    finally:
        if dht is not None:
            dht.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: one line and exit code 2 on bad input."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    warn_token_flags(args, "--token")
    try:
        build(args)  # bad regions, latencies or checkpoints are refused before anything starts
    except (SpecError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    return run_service(_run(args))


if __name__ == "__main__":
    sys.exit(main())
