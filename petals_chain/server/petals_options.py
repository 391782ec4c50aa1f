"""PETALS' own server options on our server's command line: the ones that carry over, and the ones refused.

An operator moving a ``python -m petals.cli.run_server`` command over keeps its flags, in PETALS' spelling
(``--host_maddrs``) or ours (``--host-maddrs``): device, dtype, quantisation, addresses, identity, DHT peers,
handlers, batch size and throughput go to petals' ``Server`` unchanged. ``--num_blocks`` and ``--block_indices``
are refused: the orchestrator assigns every server its blocks (README, "Run a swarm across machines").
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from petals_chain.checkpoint.quant import QUANT_TYPES
from petals_chain.checkpoint.sizing import DTYPE_CHOICES, BlockSizes
from petals_chain.cli_args import port_arg, positive_int_arg
from petals_chain.model import SpecError
from petals_chain.units import UnitError, parse_number

LOOPBACK_MADDRS = ("/ip4/127.0.0.1/tcp/0",)
THROUGHPUT_WORDS = ("auto", "eval")  # petals measures it itself; 'dry_run' (measure and exit) makes no server


def _both(name: str) -> list[str]:
    """An option in PETALS' spelling and ours: ``--host_maddrs`` and ``--host-maddrs``."""
    return [f"--{name}", f"--{name.replace('_', '-')}"]


def _throughput(text: str) -> float | str:
    """``--throughput``: a positive number (requests/s petals announces) or 'auto'/'eval'; one-line error otherwise."""
    if text in THROUGHPUT_WORDS:
        return text
    try:
        value = parse_number(text)
    except UnitError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 or one of {', '.join(THROUGHPUT_WORDS)}, got {text!r}")
    return value


class _Refused(argparse.Action):
    """An option PETALS has and the orchestrator overrides: refused with one line saying why (exit code 2)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        """Refuse, naming the option."""
        parser.error(f"{option_string} is refused: the orchestrator assigns every server its blocks "
                     "(to check that you serve a span it assigned you, use --block-indices START:END)")


def add_petals_options(p: argparse.ArgumentParser) -> None:
    """Add the PETALS server options that carry over (both spellings) and the refused ones."""
    g = p.add_argument_group("PETALS server options (as petals.cli.run_server takes them)")
    g.add_argument(*_both("device"), dest="device", default="cpu", help="torch device: cpu, cuda, cuda:1, ...")
    g.add_argument(*_both("torch_dtype"), dest="torch_dtype", default="float32", choices=DTYPE_CHOICES,
                   help="dtype of the weights and the KV cache ('auto': the checkpoint's, bfloat16 for float32 ones, "
                        "as PETALS); default float32")
    g.add_argument(*_both("quant_type"), dest="quant_type", default="none", choices=QUANT_TYPES,
                   help="store the linear weights as LLM.int8 or NF4 (bitsandbytes, CUDA only); s_m follows it")
    g.add_argument(*_both("host_maddrs"), dest="host_maddrs", nargs="+", default=None,
                   help="where the p2p node listens (default: loopback, a free port), e.g. /ip4/0.0.0.0/tcp/31337")
    g.add_argument(*_both("announce_maddrs"), dest="announce_maddrs", nargs="+", default=None,
                   help="addresses other peers should dial, e.g. /ip4/PUBLIC_IP/tcp/31337 behind a port forward")
    g.add_argument("--port", type=port_arg, default=None,
                   help="as PETALS: listen on all interfaces at this TCP port (instead of --host_maddrs)")
    g.add_argument(*_both("public_ip"), dest="public_ip", default=None,
                   help="as PETALS: announce /ip4/PUBLIC_IP/tcp/PORT (needs --port)")
    g.add_argument(*_both("identity_path"), dest="identity_path", default=None,
                   help="private key file of the p2p identity (a stable peer id; created if missing)")
    g.add_argument(*_both("initial_peers"), dest="initial_peers", nargs="+", default=None,
                   help="DHT multiaddrs to join (default: the orchestrator's)")
    g.add_argument(*_both("num_handlers"), dest="num_handlers", type=positive_int_arg, default=1,
                   help="petals connection-handler processes (default 1)")
    g.add_argument(*_both("max_batch_size"), dest="max_batch_size", type=positive_int_arg, default=None,
                   help="most tokens one forward/backward request may carry (petals' default if not given)")
    g.add_argument("--throughput", type=_throughput, default=None,
                   help="requests/s announced in the DHT, or auto/eval (default: 1/τp as measured)")
    g.add_argument(*_both("use_relay"), dest="use_relay", action="store_true",
                   help="behind NAT: be reachable through libp2p relays (PETALS' default; off here for loopback)")
    g.add_argument("--no_relay", "--no-relay", dest="use_relay", action="store_false", help=argparse.SUPPRESS)
    for name in ("num_blocks", "block_indices"):  # --block-indices (dash) is our checked claim, not this
        spellings = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if name == "num_blocks" else [])
        g.add_argument(*spellings, action=_Refused, nargs="?", help=argparse.SUPPRESS)


def listen_maddrs(args: argparse.Namespace) -> tuple[list[str], list[str] | None]:
    """(host_maddrs, announce_maddrs) from --host_maddrs/--announce_maddrs or PETALS' --port/--public_ip."""
    if args.port is not None and args.host_maddrs:
        raise SpecError("give --port or --host_maddrs, not both")
    if args.public_ip is not None and args.announce_maddrs:
        raise SpecError("give --public_ip or --announce_maddrs, not both")
    if args.public_ip is not None and not args.port:
        raise SpecError("--public_ip needs --port (the port peers dial)")
    host = list(args.host_maddrs or ([f"/ip4/0.0.0.0/tcp/{args.port}"] if args.port is not None
                                     else LOOPBACK_MADDRS))
    announce = list(args.announce_maddrs) if args.announce_maddrs else None
    if args.public_ip is not None:
        announce = [f"/ip4/{args.public_ip}/tcp/{args.port}"]
    return host, announce


def check_quant_device(quant_type: str, device: str) -> None:
    """SpecError unless the quantisation can run on the device (bitsandbytes needs CUDA)."""
    if quant_type != "none" and not device.startswith("cuda"):
        raise SpecError(f"--quant_type {quant_type} needs a CUDA device (bitsandbytes); got --device {device}")


def petals_server_kwargs(args: argparse.Namespace, sizes: BlockSizes, *, model_path: str, initial_peers: Sequence[str],
                         dht_prefix: str, tau_p_s: float) -> dict[str, Any]:
    """The keyword arguments petals' ``Server`` gets: the pass-through options, the checkpoint's sizes, our timers."""
    from petals.utils.convert_block import QuantType

    from petals_chain.protocol.dht_prefix import check_maddrs

    check_quant_device(sizes.quant_type, args.device)
    host, announce = listen_maddrs(args)
    check_maddrs(host, "--host_maddrs")
    if announce:
        check_maddrs(announce, "--announce_maddrs")
    kwargs: dict[str, Any] = dict(
        initial_peers=list(initial_peers),
        dht_prefix=dht_prefix,
        converted_model_name_or_path=model_path,
        throughput=args.throughput if args.throughput is not None else 1.0 / tau_p_s,
        num_handlers=args.num_handlers,
        attn_cache_tokens=sizes.max_length,
        torch_dtype=sizes.dtype,
        quant_type=QuantType[sizes.quant_type.upper()],
        device=args.device,
        host_maddrs=host,
        announce_maddrs=announce,
        update_period=args.update_period_s,
        request_timeout=args.request_timeout_s,
        reachable_via_relay=None if args.use_relay else False,
        use_relay=args.use_relay,
        use_auto_relay=args.use_relay,
        skip_reachability_check=True,
    )
    if args.max_batch_size is not None:
        kwargs["max_batch_size"] = args.max_batch_size
    if args.identity_path is not None:
        kwargs["identity_path"] = args.identity_path
    return kwargs
