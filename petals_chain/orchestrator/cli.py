"""``python -m petals_chain.orchestrator``: run the chain orchestrator's HTTP/JSON API.

The model comes from ``--model`` (a checkpoint directory or Hugging Face repository name, sized
with ``--torch_dtype``, ``--quant_type`` and ``--max-length`` as the servers size it), from
``--cluster FILE`` (which also lists planned servers and the load) or from
``--model-blocks/--block-bytes/--cache-bytes`` (which override the checkpoint's figures);
servers then register over HTTP and the composition follows them. ``--method`` picks the
serving method from :data:`petals_chain.compose.method_table.METHODS`: its composer, and
JFFC leases over fixed chains or a WS-RR route per request. Bad arguments print
one line and exit with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from petals_chain import defaults
from petals_chain.checkpoint.quant import QUANT_TYPES
from petals_chain.checkpoint.sizing import DTYPE_CHOICES
from petals_chain.cli_args import (
    OneLineParser,
    add_token_option,
    count_arg,
    duration_range,
    fraction_arg,
    port_arg,
    positive_float_arg,
    positive_int_arg,
    token_files,
    warn_token_flags,
    size_range,
)
from petals_chain.compose.method_table import Method, Routing, live_method, method_names
from petals_chain.compose.tuning import CRITERIA
from petals_chain.model import ModelSpec, ServerSpec, SpecError
from petals_chain.orchestrator import event_loop
from petals_chain.orchestrator.trust.auth import Credentials
from petals_chain.orchestrator.engine.composition import CompositionPolicy
from petals_chain.orchestrator.engine.config import OrchestratorConfig
from petals_chain.orchestrator.http.exposure import exposure_warnings, server_tls
from petals_chain.orchestrator.leasing.leases import LeaseManager
from petals_chain.orchestrator.leasing.managers import lease_manager
from petals_chain.orchestrator.leasing.policies import LEASE_POLICIES
from petals_chain.orchestrator.state.registry import Registry
from petals_chain.orchestrator.trust.belief import VERIFY_TIMEOUT_S
from petals_chain.moldable.live import POLICIES, WIDTH_METHODS
from petals_chain.protocol.auth import ROLE_ENV, SHARED_ENV
from petals_chain.protocol.limits import MAX_TTL_S

if TYPE_CHECKING:
    from petals_chain.orchestrator.engine.core import Orchestrator
    from petals_chain.orchestrator.state.persist import Persistence
    from petals_chain.orchestrator.trust.belief import Trust
    from petals_chain.orchestrator.leasing.widths import LeaseWidths

TOKEN_ENV = SHARED_ENV
TOKEN_FLAGS = ("--token", "--client-token", "--server-token", "--operator-token")  # each with its -file twin
STATE_DB_FILE = "state.sqlite3"  # in --state-dir
DHT_IDENTITY_FILE = "dht_identity.key"  # in --state-dir: the DHT node's private key, so its peer id stays
BYTES_RTOL = 1e-6  # --block-bytes/--cache-bytes vs a cluster file's GB figures, which are rounded


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options; sizes and durations take units (0.405GB, 2min), bare numbers are bytes and seconds."""
    p = OneLineParser(prog="python -m petals_chain.orchestrator", description=__doc__.splitlines()[0])
    p.add_argument("--method", default="proposed",
                   help=f"serving method: {', '.join(method_names(live=True, orchestrated=True))} "
                        "(default proposed; PETALS routes by itself and needs no orchestrator)")
    m = p.add_argument_group("model and load (or --cluster)")
    m.add_argument("--cluster", help="cluster YAML/JSON: model, load and planned servers")
    m.add_argument("--model", default=None, metavar="MODEL",
                   help="checkpoint directory or Hugging Face repository name (from the local cache with "
                        "HF_HUB_OFFLINE=1): L, s_m and s_c come from its config, as the servers derive them")
    m.add_argument("--torch_dtype", "--torch-dtype", dest="torch_dtype", default="float32", choices=DTYPE_CHOICES,
                   help="the servers' dtype, for s_m and s_c of --model (default float32)")
    m.add_argument("--quant_type", "--quant-type", dest="quant_type", default="none", choices=QUANT_TYPES,
                   help="the servers' weight quantisation, for s_m of --model (default none)")
    m.add_argument("--max-length", "--max_length", dest="max_length", type=positive_int_arg,
                   default=defaults.MAX_LENGTH, help="tokens per job each KV cache slot holds, for s_c of --model")
    m.add_argument("--model-blocks", type=positive_int_arg, help="L, the number of transformer blocks")
    m.add_argument("--block-bytes", type=size_range(gt=0), metavar="SIZE",
                   help="s_m, parameters per block (bytes, or e.g. 0.405GB; with --cluster: its exact value, "
                        "agreeing with the file's rounded block size)")
    m.add_argument("--cache-bytes", type=size_range(gt=0), metavar="SIZE",
                   help="s_c, KV cache per block per job (bytes, or e.g. 64MiB; with --cluster: likewise)")
    m.add_argument("--model-name", default=None, help="the model's name in the swarm (default: from --model, else "
                                                          "'model'); the DHT prefix follows it")
    m.add_argument("--arrival-rate", type=positive_float_arg,
                   help=f"λ the composition is sized for, requests/s (default {defaults.ARRIVAL_RATE})")
    m.add_argument("--target-load", type=fraction_arg, help=f"ρ̄, target utilisation (default {defaults.TARGET_LOAD})")
    m.add_argument("--pin-cluster-times", action="store_true",
                   help="servers named in --cluster keep its tau_p_s/tau_c_s (e.g. a profiler's fit) instead of the "
                        "times they measure and report themselves")
    m.add_argument("--c", type=positive_int_arg, default=None, help="fixed reserved concurrency c (default: tuned)")
    m.add_argument("--tune", default=None, choices=CRITERIA,
                   help="criterion for tuning c (default: the Theorem 3.7 lower bound; for proposed, the bounds and "
                        "the estimated mean)")
    s = p.add_argument_group("service")
    s.add_argument("--host", default="127.0.0.1", help="listen address (default loopback)")
    s.add_argument("--port", type=port_arg, default=defaults.ORCHESTRATOR_PORT, help="listen port (0 picks a free one)")
    add_token_option(s, "--token", f"one bearer token for every role (or env {TOKEN_ENV}): shorthand for the three "
                                   "below; a role's own option or variable wins over it. /health and /ready stay open")
    add_token_option(s, "--client-token", f"clients' token: leases (or env {ROLE_ENV['client']})")
    add_token_option(s, "--server-token",
                     f"servers' token: joining; each server then gets its own secret (or env {ROLE_ENV['server']})")
    add_token_option(s, "--operator-token", f"operator's token: evict, drain, /metrics (or env {ROLE_ENV['operator']})")
    s.add_argument("--metrics-open", action="store_true", help="serve /metrics to anyone (default: operator only)")
    s.add_argument("--tls-cert", default=None, help="PEM certificate (chain): serve the API over HTTPS")
    s.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    s.add_argument("--trust-registrations", action="store_true",
                   help="believe servers' registrations and heartbeats without checking them in the DHT (the "
                        "default with a DHT is to hold a server out until its peer answers there)")
    s.add_argument("--verify-timeout", "--verify-timeout-s", dest="verify_timeout_s", type=duration_range(gt=0),
                   metavar="DURATION", default=VERIFY_TIMEOUT_S,
                   help="a server not seen in the DHT (or not serving the span it claims) this long is marked dead")
    s.add_argument("--lease-ttl", "--lease-ttl-s", dest="lease_ttl_s", type=duration_range(gt=0, le=MAX_TTL_S),
                   metavar="DURATION", default=defaults.LEASE_TTL_S,
                   help="a lease not renewed for this long expires (e.g. 60s, 2min; at most 24 h)")
    s.add_argument("--heartbeat-timeout", "--heartbeat-timeout-s", dest="heartbeat_timeout_s",
                   type=duration_range(ge=0), metavar="DURATION", default=defaults.HEARTBEAT_TIMEOUT_S,
                   help="a registered server silent this long is marked dead (0 disables)")
    s.add_argument("--max-memory-bytes", type=size_range(gt=0), metavar="SIZE", default=defaults.MAX_MEMORY_BYTES,
                   help="memory budgets above this are rejected as absurd (e.g. 1PB)")
    s.add_argument("--migration", default="none", choices=LEASE_POLICIES.names("migration"),
                   help="move running sessions between chains: 'jffc' moves the slowest busy chain's session to a "
                        "faster chain's freed slot (JFFC with migration); drains work either way (default none)")
    s.add_argument("--no-repair", action="store_true",
                   help="do not repair the composition at once when servers leave or join: wait for the full "
                        "recomposition, and install it whatever it gains (docs/orchestrator.md, \"Churn\")")
    s.add_argument("--width", default=None, choices=POLICIES,
                   help="choose the speculative width of each lease that asks for one (k_max): "
                        + "; ".join(f"{m.name}: {m.help}" for m in WIDTH_METHODS.values())
                        + " (default: off; needs --speedup-profile; the headroom is --target-load)")
    s.add_argument("--speedup-profile", default=None, metavar="FILE",
                   help="the measured s(k) for --width: CSV or JSON rows with width and tokens_per_s (concave hull "
                        "fitted) or speedup (a concave table), optionally service_s at width 1 (e.g. the "
                        "moldable-live experiment's moldable_live_speedup.csv)")
    s.add_argument("--width-seed", type=count_arg, default=None, help="seed of the width draws (default: random)")
    s.add_argument("--max-waiting", type=count_arg, default=defaults.MAX_WAITING,
                   help="most lease requests allowed to wait at once")
    s.add_argument("--offer-unready-chains", action="store_true",
                   help="offer a chain as soon as it is composed (default: once every server on it reports that "
                        "it serves its span; a client then waits for a server still loading)")
    r = p.add_argument_group("restart (docs/orchestrator.md, \"Restart\")")
    r.add_argument("--state-dir", default=None, metavar="DIR",
                   help="keep the registry, leases and queue (SQLite) and the DHT identity and port here, so a "
                        "restart with the same arguments picks up where the last run stopped")
    r.add_argument("--state-sync", default="normal", choices=("normal", "full"),
                   help="SQLite synchronous mode: normal survives a killed process, full also a power loss "
                        "(slower; python -m petals_chain.bench orchestrator measures both)")
    r.add_argument("--reattach-grace", dest="reattach_grace_s", type=duration_range(gt=0, le=MAX_TTL_S),
                   metavar="DURATION", default=defaults.UNREACHABLE_WAIT_S,
                   help="a request that waited in the queue before a restart keeps its place this long for its "
                        "client to come back")
    d = p.add_argument_group("DHT (servers and clients then find it through GET /health)")
    d.add_argument("--initial-peers", nargs="*", default=[], help="multiaddrs of a DHT to join")
    d.add_argument("--start-dht", action="store_true", help="start a new DHT node here (or join --initial-peers)")
    d.add_argument("--dht-host-maddrs", nargs="*", default=["/ip4/127.0.0.1/tcp/0"],
                   help="where this DHT node listens (default: loopback, a free port)")
    d.add_argument("--dht-prefix", default=None, help="PETALS DHT prefix of the model (default: the model name)")
    p.add_argument("--log-level", default="INFO")
    return token_files(p.parse_args(argv), *TOKEN_FLAGS)


def exact_sizes(args: argparse.Namespace, model: ModelSpec) -> ModelSpec:
    """A cluster file's model with --block-bytes/--cache-bytes as its exact sizes (they must agree with the file)."""
    for flag, attr in (("--block-bytes", "block_bytes"), ("--cache-bytes", "cache_bytes")):
        given, have = getattr(args, attr), getattr(model, attr)
        if given is None:
            continue
        if not math.isclose(given, have, rel_tol=BYTES_RTOL):
            raise SpecError(f"{flag} {given:g} contradicts {args.cluster}: model has {have:g} bytes")
        model = dataclasses.replace(model, **{attr: float(given)})
    return model


def checkpoint_model(args: argparse.Namespace) -> tuple[argparse.Namespace, dict[str, Any] | None]:
    """With ``--model``: the arguments with L, s_m, s_c and the name filled in from the checkpoint (where not given),
    and what GET /swarm tells clients about it; without, the arguments as they are and None."""
    if args.model is None:
        return (args if args.model_name else argparse.Namespace(**{**vars(args), "model_name": "model"})), None
    from petals_chain.checkpoint.resolve import looks_like_path, model_display_name, resolve_model
    from petals_chain.checkpoint.sizing import block_sizes

    if args.cluster:
        raise SpecError(f"give --model or --cluster, not both ({args.cluster} sizes the model in its model section)")
    path = resolve_model(args.model)
    sizes = block_sizes(path, args.torch_dtype, args.max_length, args.quant_type)
    if args.model_blocks is not None and args.model_blocks != sizes.num_blocks:
        raise SpecError(f"--model-blocks {args.model_blocks} contradicts --model {args.model}: it has "
                        f"{sizes.num_blocks} blocks")
    filled = {"model_blocks": sizes.num_blocks, "block_bytes": args.block_bytes or float(sizes.block_bytes),
              "cache_bytes": args.cache_bytes or float(sizes.cache_bytes),
              "model_name": args.model_name or model_display_name(args.model)}
    source = str(path) if looks_like_path(args.model) else args.model
    info = {"source": source, "torch_dtype": sizes.dtype, "quant_type": sizes.quant_type,
            "max_length": sizes.max_length}
    return argparse.Namespace(**{**vars(args), **filled}), info


def registry_and_policy(args: argparse.Namespace, method: Method | None = None,
                        ) -> tuple[Registry, CompositionPolicy, list[ServerSpec]]:
    """The registry for the model the arguments describe (planned servers added), how it is composed (the method's
    composer; λ and ρ̄ from the flags, else the cluster file, else the defaults; --c, --tune) and the planned servers."""
    method = method or live_method(args.method, orchestrated=True, field="--method")
    if not method.tunes_c and (args.c is not None or args.tune is not None):
        raise SpecError(f"--c/--tune: method {method.name} does not tune c")
    planned: list[ServerSpec] = []
    if args.cluster:
        from petals_chain.compose.cluster_file import load_cluster

        cluster = load_cluster(args.cluster)
        model = exact_sizes(args, cluster.model)
        if args.model_blocks is not None and args.model_blocks != model.num_blocks:
            raise SpecError(
                f"--model-blocks {args.model_blocks} contradicts {args.cluster}: model has {model.num_blocks} blocks"
            )
        arrival, target = cluster.load.arrival_rate, cluster.load.target_load
        planned = list(cluster.servers)
    else:
        missing = [f for f in ("model_blocks", "block_bytes", "cache_bytes") if getattr(args, f) is None]
        if missing:
            flags = ", ".join("--" + f.replace("_", "-") for f in missing)
            raise SpecError(f"give --cluster FILE, or the model: missing {flags}")
        model = ModelSpec(args.model_blocks, args.block_bytes, args.cache_bytes, args.model_name)
        arrival, target = defaults.ARRIVAL_RATE, defaults.TARGET_LOAD
    policy = CompositionPolicy(
        method.compose,
        arrival_rate=args.arrival_rate if args.arrival_rate is not None else arrival,
        target_load=args.target_load if args.target_load is not None else target,
        c=args.c,
        **({"tune": args.tune} if args.tune is not None else {}),  # else the policy's own default
    )
    registry = Registry(model, max_memory_bytes=args.max_memory_bytes)
    if planned:
        registry.add_planned(planned)
    return registry, policy, planned


def engine_config(args: argparse.Namespace, *, planned: Sequence[ServerSpec] = (),
                  model_source: Mapping[str, Any] | None = None,
                  dht_info: Mapping[str, Any] | None = None) -> OrchestratorConfig:
    """The orchestrator's settings from the arguments (built once; the orchestrator never changes them)."""
    if args.pin_cluster_times and not args.cluster:
        raise SpecError("--pin-cluster-times needs --cluster FILE (the times to pin)")
    return OrchestratorConfig(
        lease_ttl_s=args.lease_ttl_s,
        heartbeat_timeout_s=args.heartbeat_timeout_s or None,
        max_waiting=args.max_waiting,
        offer_when_serving=not args.offer_unready_chains,
        migration=getattr(args, "migration", "none"),
        repair=not getattr(args, "no_repair", False),
        pinned={s.name: s for s in planned} if args.pin_cluster_times else {},
        model_source=model_source,
        dht_info=dht_info,
    )


class Parts(NamedTuple):
    """What the arguments describe before the orchestrator is assembled: its method, the arguments with the
    checkpoint's sizes filled in, the registry (planned servers added), how it is composed, and the settings."""

    method: Method
    args: argparse.Namespace
    registry: Registry
    composition_policy: CompositionPolicy
    planned: list[ServerSpec]
    config: OrchestratorConfig


def build_parts(args: argparse.Namespace) -> Parts:
    """The method, registry, composition policy and settings the arguments describe (bad arguments: SpecError before
    anything starts)."""
    method = live_method(args.method, orchestrated=True, field="--method")
    args, model_source = checkpoint_model(args)
    registry, policy, planned = registry_and_policy(args, method)
    return Parts(method, args, registry, policy, planned,
                 engine_config(args, planned=planned, model_source=model_source))


def assemble(parts: Parts, *, dht_info: Mapping[str, Any] | None = None, trust: Trust | None = None,
             state: Persistence | None = None) -> Orchestrator:
    """The orchestrator of ``parts`` with its collaborators (built first: the DHT it runs, the trust layer with its
    verifier, --state-dir's store), planned servers composed."""
    from petals_chain.orchestrator.engine.core import Orchestrator

    config = parts.config if dht_info is None else parts.config.replace(dht_info=dht_info)
    orch = Orchestrator(
        parts.registry,
        config,
        composition_policy=parts.composition_policy,
        lease_manager=_lease_manager(parts.method, config),
        trust=trust,
        widths=lease_widths(parts.args, parts.method, parts.composition_policy),
        state=state,
    )
    if parts.planned:
        orch.recompose_now()
        if parts.registry.composition is None:
            print(f"warning: no composition for {parts.args.cluster}: {parts.registry.error}", file=sys.stderr)
    return orch


def build_orchestrator(args: argparse.Namespace, *, dht_info: Mapping[str, Any] | None = None,
                       ) -> tuple[Orchestrator, Method]:
    """The orchestrator the arguments describe (the method's composer and lease manager), planned servers composed."""
    parts = build_parts(args)
    return assemble(parts, dht_info=dht_info), parts.method


def lease_widths(args: argparse.Namespace, method: Method, policy: CompositionPolicy) -> LeaseWidths | None:
    """With --width: the width rule for the orchestrator's leases, s(k) from --speedup-profile; the priors of the
    measured load are the profile's service time at width 1 and the composition's --arrival-rate."""
    width, profile = getattr(args, "width", None), getattr(args, "speedup_profile", None)
    if width is None:
        if profile is not None:
            raise SpecError("--speedup-profile: give --width too (the profile is only read to choose widths)")
        return None
    if profile is None:
        raise SpecError(f"--width {width}: give --speedup-profile FILE (the measured s(k) it chooses from)")
    if method.routing is not Routing.JFFC:
        raise SpecError(f"--width: needs JFFC leases; method {args.method!r} routes each request")
    import numpy as np

    from petals_chain.moldable.live import speedup_profile
    from petals_chain.orchestrator.leasing.widths import LeaseWidths

    measured = speedup_profile(profile)
    gap_s = 1.0 / policy.arrival_rate
    return LeaseWidths(measured.lone, width, np.random.default_rng(args.width_seed),
                       mean_size_s=measured.service_s or gap_s, mean_interarrival_s=gap_s,
                       headroom=policy.target_load, batched=measured.batched)


def _lease_manager(method: Method, config: OrchestratorConfig) -> Callable[..., LeaseManager]:
    """The method's lease manager (leasing/managers.py, by the registry's routing policy); JFFC's moves sessions
    by ``--migration``."""
    try:
        return lease_manager(method.routing.value, config.migration)
    except SpecError as exc:
        raise SpecError(f"method {method.name!r}: {exc}") from None


async def _run(args: argparse.Namespace) -> None:
    """Open the state, start the DHT, build the orchestrator (planned servers composed), restore it, and serve
    until a signal."""
    from petals_chain.orchestrator.trust.belief import Trust
    from petals_chain.orchestrator.trust.verify import DhtVerifier

    credentials = Credentials.resolve(args.token, client=args.client_token, server=args.server_token,
                                      operator=args.operator_token, metrics_open=args.metrics_open)
    ssl_context = server_tls(args.tls_cert, args.tls_key)
    for line in exposure_warnings(args.host, credentials, tls=ssl_context is not None):
        print(f"warning: {line}", file=sys.stderr, flush=True)
    parts = build_parts(args)
    registry, method = parts.registry, parts.method
    state = open_state(args) if args.state_dir else None
    dht = dht_info = None
    try:
        if args.initial_peers or args.start_dht:
            from petals_chain.orchestrator.dht import start_dht
            from petals_chain.protocol.dht_prefix import dht_prefix_for

            prefix = dht_prefix_for(args.dht_prefix or registry.model.name.split("/")[-1])  # a repository: its last
            if state is not None:
                dht = start_dht(args.initial_peers, dht_host_maddrs(state, args.dht_host_maddrs),
                                identity_path=str(Path(args.state_dir) / DHT_IDENTITY_FILE))
                remember_dht_maddrs(state, args.dht_host_maddrs, dht.visible_maddrs)
            else:
                dht = start_dht(args.initial_peers, args.dht_host_maddrs)
            dht_info = {"initial_peers": dht.visible_maddrs, "dht_prefix": prefix}
            print(f"dht listening on {' '.join(dht.visible_maddrs)} (prefix {prefix!r})", flush=True)
        verifier = DhtVerifier(dht.dht, prefix) if dht and not args.trust_registrations else None
        orch = assemble(parts, dht_info=dht_info, trust=Trust(verifier, verify_timeout_s=args.verify_timeout_s),
                        state=state)
        if state is not None:
            state.restore(attach_grace_s=args.reattach_grace_s)
        await _serve(orch, method, credentials, ssl_context, args.host, args.port)
    finally:
        if dht is not None:
            dht.shutdown()
        if state is not None:
            await state.close()


async def _serve(orch: Orchestrator, method: Method, credentials: Credentials, ssl_context: Any, host: str,
                 port: int) -> None:
    """Serve the orchestrator's API until a signal, printing its address once listening."""
    from petals_chain.orchestrator.http.api import build_app, serve

    registry = orch.registry

    def ready(host: str, port: int) -> None:
        """Print the address once listening (scripts wait for this line)."""
        h = orch.health()
        scheme = "https" if ssl_context is not None else "http"
        print(f"orchestrator listening on {scheme}://{host}:{port} (method {method.name}; "
              f"model {registry.model.name!r}, {registry.model.num_blocks} blocks; "
              f"composition v{h['version']}: {h['chains']} chains, "
              f"capacity {h['capacity']})", flush=True)

    await serve(build_app(orch, credentials=credentials), host, port, on_ready=ready, ssl_context=ssl_context)


def open_state(args: argparse.Namespace) -> Persistence:
    """Open (or create) --state-dir's store (on the running event loop); the orchestrator restores from it."""
    from petals_chain.orchestrator.state.persist import Persistence
    from petals_chain.orchestrator.state.store import StateStore

    if live_method(args.method, orchestrated=True, field="--method").routing is not Routing.JFFC:
        raise SpecError(f"--state-dir: method {args.method} routes each request (WS-RR); only JFFC leases over "
                        "fixed chains are kept across restarts")
    folder = Path(args.state_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"--state-dir {folder}: cannot create it: {exc}") from None
    return Persistence(StateStore(folder / STATE_DB_FILE, synchronous=args.state_sync))


def dht_host_maddrs(state: Persistence, requested: Sequence[str]) -> list[str]:
    """The addresses the DHT listened on last time (ports included) if it was asked for the same ones, else these."""
    meta = state.meta
    if meta.get("dht_requested_maddrs") == json.dumps(list(requested)) and "dht_host_maddrs" in meta:
        return json.loads(meta["dht_host_maddrs"])
    return list(requested)


def remember_dht_maddrs(state: Persistence, requested: Sequence[str], visible: Sequence[str]) -> None:
    """Keep the addresses the DHT got (a free port, if asked for port 0) for the next start with the same request."""
    ports = [int(m.split("/tcp/")[1].split("/")[0]) for m in visible if "/tcp/" in m]
    if not ports:
        return
    hosts = [m[: -len("/tcp/0")] + f"/tcp/{ports[0]}" if m.endswith("/tcp/0") else m for m in requested]
    state.store.set_meta("dht_requested_maddrs", json.dumps(list(requested)))
    state.store.set_meta("dht_host_maddrs", json.dumps(hosts))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run until SIGINT/SIGTERM; one line and exit code 2 on bad input."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    warn_token_flags(args, *TOKEN_FLAGS)
    return run_service(_run(args))


def run_service(service: Coroutine[Any, Any, None]) -> int:
    """Run a service until SIGINT/SIGTERM (exit code 0); bad input or an unusable port: one line, exit code 2.
    The loop is uvloop (orchestrator/event_loop.py)."""
    try:
        event_loop.run(service)
    except (SpecError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
