"""``python -m petals_chain.server MODEL --orchestrator URL --memory-budget 20GB``: one orchestrated PETALS server.

It measures its per-block time τp on this machine and its round trip to the
orchestrator (→ τc), registers with its memory budget, serves exactly the span the
orchestrator assigns (reloading when reassigned) with a KV cache of
⌊(M − s_m·m)/s_c⌋ block-job slots. The DHT's address and the model's DHT prefix come
from the orchestrator unless given. MODEL is a checkpoint directory or a Hugging Face
repository name, and PETALS' own server options carry over (server.petals_options).
Bad input prints one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from petals_chain import defaults
from petals_chain.cli_args import (EXIT_BAD_INPUT, OneLineParser, add_token_option, checked_text, duration_range,
                                   count_arg, float_arg, positive_int_arg, token_files, warn_token_flags)
from petals_chain.device_profile import device_name
from petals_chain.model import SpecError
from petals_chain.server.petals_options import add_petals_options, petals_server_kwargs
from petals_chain.units import parse_size

DRAIN_TIMEOUT_S = 60.0  # on SIGTERM: how long the server waits for the orchestrator to move its sessions away


def _reserve(text: str) -> float | None:
    """``--reserve``: 'auto' (None) or a size (bytes); UnitError on anything else."""
    return None if text == "auto" else parse_size(text)


def _region(text: str) -> str:
    """``--region``: a non-empty name without '/' (or 'auto'); ValueError otherwise."""
    if not text or "/" in text or text != text.strip():
        raise ValueError(f"expected a region name or 'auto', got {text!r}")
    return text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options; sizes and durations take units (20GB, 512MB; 500ms, 2s); bare numbers: bytes, seconds."""
    p = OneLineParser(prog="python -m petals_chain.server", description=__doc__.splitlines()[0])
    p.add_argument("model_dir", metavar="MODEL",
                   help="checkpoint directory (config.json + weights) or Hugging Face repository name (from the local "
                        "cache when HF_HUB_OFFLINE=1, the default here)")
    p.add_argument("--orchestrator", required=True, help="orchestrator URL, e.g. http://127.0.0.1:8700")
    p.add_argument("--region", default=None, type=checked_text(_region, "region name"),
                   help="at a region-aware orchestrator (regions_cli): join this region, or 'auto' to be placed by "
                        "the measured round trips to the regions' anchors")
    p.add_argument("--memory-budget", required=True, type=checked_text(parse_size, "size"),
                   help="memory of this server, e.g. 20GB or 300MB")
    p.add_argument("--reserve", default="auto", type=checked_text(_reserve, "size"),
                   help="memory kept out of M_j for the process itself (CUDA context, activations): a size, or "
                        "'auto' (on a CUDA device 0.7 GiB + one max-length prefill's activations; on a CPU 0); "
                        "M_j = budget - reserve is what blocks + KV cache get")
    p.add_argument("--name", default=None, help="server name at the orchestrator (default: host-pid)")
    add_token_option(p, "--token", "the orchestrator's server token (or env PETALS_CHAIN_SERVER_TOKEN, else "
                                   "PETALS_CHAIN_ORCH_TOKEN); the server then uses its own secret")
    p.add_argument("--max-length", type=positive_int_arg, default=defaults.MAX_LENGTH,
                   help="tokens per job the cache is sized for (s_c); must match the orchestrator's model")
    p.add_argument("--job-input-tokens", type=positive_int_arg, default=defaults.JOB_INPUT_TOKENS,
                   help="l_in of the job τp is measured for")
    p.add_argument("--job-output-tokens", type=positive_int_arg, default=defaults.JOB_OUTPUT_TOKENS,
                   help="l_out of the job τp and τc are for")
    p.add_argument("--tau-p", "--tau-p-s", dest="tau_p_s", type=duration_range(gt=0), metavar="DURATION", default=None,
                   help="use this per-block time (e.g. 120ms) instead of measuring it (an emulated slower device)")
    p.add_argument("--block-indices", default=None,
                   help="serve exactly start:end, only if the orchestrator assigned it (else exit with its refusal)")
    p.add_argument("--dht-prefix", "--dht_prefix", dest="dht_prefix", default=None,
                   help="PETALS DHT prefix (default: the orchestrator's)")
    p.add_argument("--torch-threads", type=positive_int_arg, default=1, help="torch CPU threads of this server")
    p.add_argument("--heartbeat-period", "--heartbeat-period-s", dest="heartbeat_period_s", type=duration_range(gt=0),
                   metavar="DURATION", default=defaults.HEARTBEAT_PERIOD_S)
    p.add_argument("--settle", "--settle-s", dest="settle_s", type=duration_range(ge=0), metavar="DURATION",
                   default=defaults.SETTLE_S,
                   help="load a span only once the assignment has not changed for this long (others still joining)")
    p.add_argument("--update-period", "--update-period-s", dest="update_period_s", type=duration_range(gt=0),
                   metavar="DURATION", default=defaults.DHT_UPDATE_PERIOD_S,
                   help="how often blocks are re-announced in the DHT")
    p.add_argument("--request-timeout", "--request-timeout-s", dest="request_timeout_s", type=duration_range(gt=0),
                   metavar="DURATION", default=defaults.SERVER_REQUEST_TIMEOUT_S)
    p.add_argument("--drain-timeout", "--drain-timeout-s", dest="drain_timeout_s", type=duration_range(ge=0),
                   metavar="DURATION", default=DRAIN_TIMEOUT_S,
                   help="on SIGTERM, ask the orchestrator to move this server's sessions elsewhere and wait at most "
                        "this long before leaving (0: leave at once)")
    g = p.add_argument_group("batching of different sessions' inference steps (docs/batching.md)")
    g.add_argument("--max-batch-sessions", type=positive_int_arg, default=defaults.MAX_BATCH_SESSIONS,
                   help="most sessions whose steps run as one forward pass (1: PETALS' one-at-a-time pool, exactly "
                        f"as before batching existed); default {defaults.MAX_BATCH_SESSIONS}")
    g.add_argument("--batch-window-ms", type=float_arg(ge=0, le=10_000), default=defaults.BATCH_WINDOW_S * 1e3,
                   metavar="MS", help="how long a step waits for sessions of the last batches that have not sent "
                                      "their next step yet (a lone session never waits); default "
                                      f"{defaults.BATCH_WINDOW_S * 1e3:g}")
    g.add_argument("--max-batch-tokens", type=positive_int_arg, default=defaults.MAX_BATCH_TOKENS,
                   help="most tokens (hypotheses x new tokens over all sessions) in one batched step; longer steps "
                        f"run in chunks (--prefill-chunk-tokens); default {defaults.MAX_BATCH_TOKENS}")
    g.add_argument("--prefill-chunk-tokens", type=_positive_int_or_auto, default=None, metavar="N|auto",
                   help="most tokens a long step (a prompt, a failover replay) advances per batched step; longer "
                        "ones run in chunks beside the other sessions' steps; auto: "
                        f"{defaults.PREFILL_CHUNK_TOKENS_CUDA} on a CUDA device, {defaults.PREFILL_CHUNK_TOKENS_CPU} "
                        "on a CPU (measured: bench server-prefill); default auto")
    g.add_argument("--batch-attention", choices=defaults.BATCH_ATTENTION_MECHANISMS, default=defaults.BATCH_ATTENTION,
                   help="how a batched decode step attends: per_session (each session over its own cache in place), "
                        "gathered (the caches copied into one padded batch, one attention), auto (gathered on a "
                        f"CUDA device, else per session); default {defaults.BATCH_ATTENTION}")
    g.add_argument("--kv-arena", choices=defaults.KV_ARENA_MODES, default=defaults.KV_ARENA,
                   help="keep the sessions' KV caches as rows of one tensor per block, so a batched decode attends "
                        "over them in place (each session is charged a full slot): on, off, or auto (on for caches "
                        f"on a CUDA device); needs batching; default {defaults.KV_ARENA}")
    g.add_argument("--runtime-cpus", type=_cpu_list, default=(), metavar="LIST",
                   help="run the runtime thread (the one that computes every inference step) on these CPUs, e.g. "
                        "0 or 0-3,8, and the server's other threads and processes (connection handlers, DHT, pools) "
                        "on the others: a step is then not slowed by the RPC work of the sessions it serves")
    g.add_argument("--step-log", default="", metavar="CSV",
                   help="append one row per batched inference step (sessions, tokens, seconds of the step itself) "
                        "to this CSV: the server's own step times, as the profiler reads them for tau_p(b)")
    g.add_argument("--bare-probe-every", type=count_arg, default=0, metavar="N",
                   help="after every N-th decode batch, also time the bare batched forward of the same blocks over "
                        "as many sessions at their mean context with preallocated caches, and log it beside the "
                        "step (--step-log, column bare_seconds): the runtime's overhead measured where it runs; "
                        "costs one more forward every N batches and scratch caches; default 0 (off)")
    e = p.add_argument_group("an emulated device (docs/testbed.md, \"Emulated devices\")")
    e.add_argument("--emulate-device", default=os.environ.get("PETALS_CHAIN_DEVICE", "") or None, metavar="NAME",
                   type=checked_text(device_name, "device name"),
                   help="compute every step on this checkpoint, then wait until the named device's time for it has "
                        "passed (petals_chain.device_profile: h100, a100-3g.40gb, a100-2g.20gb); memory and cache are "
                        "counted in the units of the model that device serves (LLaMA-2-7B); default: env "
                        "PETALS_CHAIN_DEVICE")
    e.add_argument("--time-dilation", type=float_arg(ge=1, le=1000),
                   default=float(os.environ.get("PETALS_CHAIN_TIME_DILATION", "1") or 1), metavar="K",
                   help="with --emulate-device, every device time x K (a run whose every duration is dilated by K)")
    e.add_argument("--device-log", default=os.environ.get("PETALS_CHAIN_DEVICE_LOG", ""), metavar="CSV",
                   help="with --emulate-device, append each step's real and device seconds to this CSV")
    p.add_argument("--log-level", default="INFO")
    add_petals_options(p)
    return token_files(p.parse_args(argv), "--token")


def _positive_int_or_auto(text: str) -> int | None:
    """'auto' → None (chosen by the server's device), else a positive integer (argparse type)."""
    if text == "auto":
        return None
    return positive_int_arg(text)


def _cpu_list(text: str) -> tuple[int, ...]:
    """'0', '0-3,8' → CPU numbers (argparse type; one-line error on anything else)."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            a, _, b = part.strip().partition("-")
            lo, hi = int(a), int(b) if b else int(a)
            if lo < 0 or hi < lo:
                raise ValueError
            cpus.update(range(lo, hi + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a CPU list such as 0 or 0-3,8") from None
    available = os.sched_getaffinity(0)
    if not cpus <= available or cpus == available:
        raise argparse.ArgumentTypeError(f"{text!r} must name some, not all, of the CPUs this process may use"
                                         f" ({','.join(map(str, sorted(available)))})")
    return tuple(sorted(cpus))


def _parse_span(text: str, num_blocks: int) -> tuple[int, int]:
    """'start:end' within 0..num_blocks, start < end."""
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise SpecError(f"--block-indices {text!r} must be start:end (two integers), e.g. 0:15") from None
    if not 0 <= a < b <= num_blocks:
        raise SpecError(f"--block-indices {text!r} must satisfy 0 <= start < end <= {num_blocks}")
    return a, b


def _positive(name: str, value: float | None) -> None:
    """SpecError unless value is None or > 0."""
    if value is not None and not value > 0:
        raise SpecError(f"--{name} must be > 0, got {value!r}")


def batching_config(args: argparse.Namespace) -> Any:
    """The server's ``BatchingConfig`` from ``--max-batch-sessions``, ``--batch-window-ms``, ``--max-batch-tokens``,
    ``--prefill-chunk-tokens``, ``--batch-attention``, ``--runtime-cpus``, ``--kv-arena``, ``--step-log``,
    ``--bare-probe-every``."""
    from petals_chain.server.batching import BatchingConfig

    return BatchingConfig(max_sessions=args.max_batch_sessions, window_s=args.batch_window_ms / 1e3,
                          max_tokens=args.max_batch_tokens, prefill_chunk_tokens=args.prefill_chunk_tokens,
                          step_log=args.step_log, attention=args.batch_attention,
                          runtime_cpus=args.runtime_cpus, kv_arena=args.kv_arena,
                          bare_probe_every=args.bare_probe_every)


def build_server(args: argparse.Namespace) -> Any:
    """Validate everything, measure, start the DHT node, register: the OrchestratedServer ready to run()."""
    from petals_chain.checkpoint.resolve import resolve_model
    from petals_chain.checkpoint.sizing import block_sizes, measure_tau_p, parse_budget, parse_reserve
    from petals_chain.server.petals_options import check_quant_device, listen_maddrs

    memory = parse_budget(args.memory_budget)  # the options first, before petals is imported: one clean line
    check_quant_device(args.quant_type, args.device)
    listen_maddrs(args)
    model_dir = resolve_model(args.model_dir)
    from petals_chain.protocol.blocking import BlockingOrchestrator
    from petals_chain.protocol.dht_prefix import check_maddrs, dht_prefix_for
    from petals_chain.server.petals_server import OrchestratedServer, check_against_orchestrator, profile_server
    from petals_chain.service_time import Workload

    for name in ("tau_p_s", "heartbeat_period_s", "update_period_s", "request_timeout_s"):
        _positive(name.replace("_", "-"), getattr(args, name))
    if args.job_input_tokens < 1 or args.job_output_tokens < 1:
        raise SpecError("--job-input-tokens and --job-output-tokens must be >= 1")
    if args.job_input_tokens + args.job_output_tokens > args.max_length:
        raise SpecError(f"--job-input-tokens + --job-output-tokens exceed --max-length {args.max_length}")
    sizes = block_sizes(model_dir, args.torch_dtype, args.max_length, args.quant_type)
    if args.emulate_device:  # count blocks and slots in the emulated model's units; keep its time on every step
        from petals_chain.device_profile import emulated_sizes
        from petals_chain.server import device_clock

        sizes = sizes.emulated(*emulated_sizes(args.max_length))
        if args.prefill_chunk_tokens is None:  # batch as the server would on the GPU it stands for
            args.prefill_chunk_tokens = defaults.PREFILL_CHUNK_TOKENS_CUDA
        if device_clock.CLOCK is None:
            device_clock.install(device_clock.ClockSettings(args.emulate_device, args.time_dilation, args.device_log))
    reserve = sizes.runtime_reserve_bytes(args.device) if args.reserve == "auto" else parse_reserve(args.reserve)
    budget, memory = memory, memory - reserve
    need = sizes.block_bytes + sizes.cache_bytes
    if memory < need:
        raise SpecError(
            f"--memory-budget {args.memory_budget} = {budget:.4g} B less --reserve {reserve:.4g} B cannot hold one "
            f"block ({sizes.block_bytes} B) plus one cache slot ({sizes.cache_bytes} B of {args.max_length} tokens); "
            f"need >= {need + reserve:.0f} B"
        )
    span = _parse_span(args.block_indices, sizes.num_blocks) if args.block_indices else None
    name = args.name or f"{os.uname().nodename.split('.')[0]}-{os.getpid()}"
    from petals_chain.protocol.auth import role_token

    token = role_token("server", args.token)

    if args.region is not None:  # the front places us; from here on we talk to our region's orchestrator
        from petals_chain.server.region import place_server

        args.orchestrator, placed = place_server(args.orchestrator, name, args.region, token)
        print(f"server {name!r} placed in region {placed['region']!r} (by {placed['by']})", flush=True)
    orch = BlockingOrchestrator(args.orchestrator, token=token)

    h = orch.run(lambda c: c.health(), timeout_s=defaults.CALL_TIMEOUT_S)
    check_against_orchestrator(h, sizes)
    dht = h.get("dht") or {}
    peers = args.initial_peers if args.initial_peers is not None else dht.get("initial_peers")
    if not peers:
        raise SpecError("no DHT to join: give --initial-peers, or start the orchestrator with --start-dht")
    check_maddrs(peers, "--initial-peers")
    prefix = dht_prefix_for(args.dht_prefix or dht.get("dht_prefix") or (h.get("model") or {}).get("name") or "")

    import torch

    start_shm_manager()
    torch.set_num_threads(max(1, args.torch_threads))
    workload = Workload(args.job_input_tokens, args.job_output_tokens)
    slowdown = None
    if args.emulate_device:  # the device's τp and g(b), not this checkpoint's on this CPU
        from petals_chain.device_profile import device

        emulated = device(args.emulate_device).dilated(args.time_dilation)
        if args.tau_p_s is None:
            args.tau_p_s = emulated.job_s(args.job_input_tokens, args.job_output_tokens)
        slowdown = emulated.batch_slowdown(args.job_input_tokens, args.job_output_tokens, args.max_batch_sessions)
    tau_p_s = args.tau_p_s or measure_tau_p(model_dir, sizes.dtype, args.job_input_tokens, args.job_output_tokens)
    profile = profile_server(orch, name, memory, tau_p_s, workload, max_batch_sessions=args.max_batch_sessions,
                             batch_slowdown=slowdown, device=args.emulate_device)
    server = OrchestratedServer(
        orchestrator=orch,
        profile=profile,
        sizes=sizes,
        fixed_span=span,
        heartbeat_period_s=args.heartbeat_period_s,
        settle_s=args.settle_s,
        batching=batching_config(args),
        **petals_server_kwargs(args, sizes, model_path=str(model_dir), initial_peers=peers, dht_prefix=prefix,
                               tau_p_s=tau_p_s),
    )
    try:
        server.register()
    except BaseException:
        server.shutdown(leave_reason=None)
        raise
    return server


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: serve until SIGINT/SIGTERM; one line and exit code 2 on bad input or a refused claim."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    warn_token_flags(args, "--token")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # transformers' deprecation notice about torch's pytree API, printed on import: noise around a one-line error
    warnings.filterwarnings("ignore", message=".*_register_pytree_node", category=FutureWarning)
    built: list[Any] = []  # the server, once registered: SIGTERM/SIGINT drain it first
    install_stop_signals(built, args.drain_timeout_s)
    from petals_chain.protocol.http_client import OrchestratorError, OrchestratorUnreachableError
    from petals_chain.server.petals_server import ClaimRefusedError, RegistrationError

    server = None
    code = 0
    reason = "shutting down"
    try:
        server = build_server(args)
        print(f"server {server.profile.name!r} registered: peer {server.peer_id}", flush=True)
        server.start_heartbeats()
        built.append(server)
        server.run()
    except (SpecError, RegistrationError, ClaimRefusedError, OrchestratorUnreachableError, OrchestratorError,
            TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        code, reason = EXIT_BAD_INPUT, ("claim refused" if isinstance(exc, ClaimRefusedError) else "error")
    except KeyboardInterrupt:
        pass
    except Exception:  # unexpected: show it, but still leave the orchestrator and end our children
        import traceback

        traceback.print_exc()
        code, reason = 1, "crashed"
    if server is not None:
        _quiet_shutdown(server, reason)
    else:
        reap_children()
    return code


def install_stop_signals(built: list[Any], drain_timeout_s: float) -> None:
    """SIGTERM and SIGINT (Ctrl-C) both stop the server gracefully: the main process has its sessions moved elsewhere
    (a drain, while it still serves, at most ``drain_timeout_s``), leaves the orchestrator and exits with code 0.

    A second SIGINT cuts the drain short and the server leaves at once (still cleanly); a second SIGTERM waits for
    the drain, as before. A forked child (DHT, connection handler) exits on SIGTERM and ignores SIGINT: Ctrl-C reaches
    the whole process group, and the main process stops its children itself once it has drained. The handlers are
    installed whatever the process inherited: a server started from a script's background job (where SIGINT starts
    out ignored) still stops on SIGINT.
    """
    main_pid = os.getpid()
    stopping: list[int] = []  # the signals received so far (main process)

    def on_stop(signum: int, frame: Any) -> None:
        """Drain (first signal), then stop by KeyboardInterrupt, which main() turns into a clean shutdown."""
        if os.getpid() != main_pid:
            if signum == signal.SIGINT:
                return  # the main process drains, then ends its children
            os._exit(128 + signum)
        if stopping:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for the drain, leave now
            return  # a second SIGTERM waits for the drain
        stopping.append(signum)
        if built and drain_timeout_s > 0:
            built.pop().drain_self(drain_timeout_s)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)


def _quiet_shutdown(server: Any, reason: str) -> None:
    """Shut the server down, ignoring a second Ctrl-C/SIGTERM while doing so; then end any child left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        server.shutdown(leave_reason=reason)
    except Exception as exc:  # shutting down: report and carry on
        print(f"warning: shutdown: {exc}", file=sys.stderr)
    reap_children()


SHM_MANAGER = "torch_shm_manager"  # torch's helper process behind hivemind's file_system tensor sharing


def _shm_manager(proc: Any) -> bool:
    """Whether ``proc`` (a psutil.Process) is torch's shared-memory manager."""
    try:
        return proc.name() == SHM_MANAGER
    except Exception:  # gone, or not ours to inspect
        return False


def start_shm_manager() -> None:
    """Start torch's shared-memory manager now, with SIGINT ignored, so that it inherits SIGINT ignored.

    hivemind shares tensors with torch's ``file_system`` strategy, whose ``torch_shm_manager`` child process must
    outlive every shared tensor of this process: freeing one after the manager died throws ``std::system_error``
    (Broken pipe) from a destructor, and the process aborts (SIGABRT, "terminate called after throwing..."). Torch
    starts the manager lazily, once per process; started here it ignores the Ctrl-C that reaches the whole process
    group, and :func:`reap_children` leaves it alone (it exits by itself once this process is gone).
    """
    import torch
    import torch.multiprocessing

    strategy = os.environ.get("HIVEMIND_MEMORY_SHARING_STRATEGY", "file_system")  # hivemind's choice (mpfuture)
    torch.multiprocessing.set_sharing_strategy(strategy)
    if strategy != "file_system":
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        torch.zeros(1).share_memory_()  # the first shared tensor starts the manager
    finally:
        signal.signal(signal.SIGINT, previous)


def reap_children(timeout_s: float = 5.0) -> int:
    """Terminate (then kill) every process this one started that is still alive, e.g. petals' reachability
    probe p2pd, which its background thread may not have stopped yet; returns how many there were. Torch's
    shared-memory manager is left to exit by itself (see :func:`start_shm_manager`)."""
    import psutil

    children = [c for c in psutil.Process().children(recursive=True) if c.is_running() and not _shm_manager(c)]
    for c in children:
        try:
            c.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=timeout_s)
    for c in alive:
        try:
            c.kill()
        except psutil.NoSuchProcess:
            pass
    return len(children)


def exit_now(code: int) -> None:
    """End the process with ``code`` once main() has shut everything down (left the orchestrator, stopped PETALS'
    server, ended every child), without the interpreter's teardown: native library threads still running then (the
    p2p and torch machinery) may throw from static destructors (``terminate called after throwing an instance of
    'std::system_error'``), which turns a clean exit into SIGABRT."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
