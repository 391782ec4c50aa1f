"""Run a PETALS server (plain or orchestrated) as a slower device: each block's compute is stretched by 1/speed.

CPU stand-ins of the testbed (docs/testbed.md) learn their speed factor ``f`` ∈ (0, 1] from
``PETALS_CHAIN_SPEED_FACTOR``; enforcing it is the server's job. This entry point wraps petals'
``TransformerBackend.inference_step`` and ``forward``: after a call that used ``c`` seconds of this
thread's CPU, it sleeps ``c · (1/f − 1)``, so the block takes as long as on a device ``1/f`` times
slower while the shared cores stay free for the other servers. It also sends stdout to stderr (the
launcher only reads a ready line from stdout; a chatty server must not fill that pipe), then runs

    python -m petals_chain.launch.slowdown petals ARGS...        # = python -m petals.cli.run_server ARGS...
    python -m petals_chain.launch.slowdown batched ARGS...       # the same with our batching pool (defaults)
    python -m petals_chain.launch.slowdown orchestrated ARGS...  # = python -m petals_chain.server ARGS...

Our batched step of several sessions (server/batched_step.py) does not go through ``inference_step``, so it is
stretched too: without that, a batching server would run at the full speed of the host.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

SPEED_ENV = "PETALS_CHAIN_SPEED_FACTOR"
ENTRIES = ("petals", "batched", "orchestrated")


def speed_factor_from_env(env: dict[str, str] | None = None) -> float:
    """The speed factor in (0, 1] from PETALS_CHAIN_SPEED_FACTOR (1.0 when unset); ValueError naming it if bad."""
    raw = (env if env is not None else os.environ).get(SPEED_ENV, "1.0")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{SPEED_ENV}={raw!r} is not a number") from None
    if not 0 < value <= 1:
        raise ValueError(f"{SPEED_ENV}={raw!r} must be in (0, 1] (1 = the fastest kind)")
    return value


def stretched(fn: Callable[..., Any], speed: float, clock: Callable[[], float] = time.thread_time,
              sleep: Callable[[float], None] = time.sleep) -> Callable[..., Any]:
    """``fn`` followed by a sleep of (1/speed − 1) × the CPU time it used (no sleep at speed 1)."""
    extra = 1.0 / speed - 1.0

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        """Call the wrapped block method, then wait as long as a slower device would have needed in addition."""
        t0 = clock()
        out = fn(*args, **kwargs)
        if extra > 0:
            sleep(max(0.0, clock() - t0) * extra)
        return out

    return wrapper


def install(speed: float) -> bool:
    """Stretch petals' per-block compute, and our batched step of several sessions, by 1/speed (in this process);
    False when speed is 1 (nothing to do)."""
    if speed >= 1.0:
        return False
    from petals.server.backend import TransformerBackend

    from petals_chain.server.batched_step import BatchedMergedInferenceStep

    for cls, name in ((TransformerBackend, "inference_step"), (TransformerBackend, "forward"),
                      (BatchedMergedInferenceStep, "__call__")):
        original = getattr(cls, name)
        if not getattr(original, "_petals_chain_stretched", False):
            wrapper = stretched(original, speed)
            wrapper._petals_chain_stretched = True  # type: ignore[attr-defined]
            setattr(cls, name, wrapper)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Install the slowdown, then hand over to petals' or our server entry point with the remaining arguments."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ENTRIES:
        print(f"usage: python -m petals_chain.launch.slowdown {{{','.join(ENTRIES)}}} SERVER_ARGS...", file=sys.stderr)
        return 2
    entry, rest = args[0], args[1:]
    try:
        speed = speed_factor_from_env()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    os.dup2(2, 1)  # stdout -> stderr: nobody drains the launcher's stdout pipe after the ready line
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    from petals_chain.server import device_clock

    try:
        clock = device_clock.ClockSettings.from_env()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if clock is not None and speed < 1.0:
        print(f"error: {SPEED_ENV} and {device_clock.DEVICE_ENV} both set: a server keeps one device's time",
              file=sys.stderr)
        return 2
    if clock is not None:
        device_clock.install(clock)
        print(f"slowdown: emulating {clock.device}, time x{clock.dilation:g}", file=sys.stderr, flush=True)
    else:
        install(speed)
        print(f"slowdown: speed factor {speed:g} (compute stretched x{1 / speed:.3f})", file=sys.stderr, flush=True)
    if entry in ("petals", "batched"):
        from petals.cli import run_server

        if entry == "batched":
            from petals_chain.server.batching import BatchingConfig, install_batching

            install_batching(BatchingConfig())

        sys.argv = ["petals.cli.run_server", *rest]
        run_server.main()
        return 0
    from petals_chain.server import cli as server_cli

    return server_cli.main(rest)


if __name__ == "__main__":
    sys.exit(main())
