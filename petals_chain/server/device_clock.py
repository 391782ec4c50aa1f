"""Make a server keep the time of an emulated device: compute each step for real, then wait for the device's time.

A server started with ``PETALS_CHAIN_DEVICE=a100-3g.40gb`` (and optionally ``PETALS_CHAIN_TIME_DILATION=k``,
``PETALS_CHAIN_DEVICE_LOG=steps.csv``) runs every inference step on its real (small) model, so each token stays
checkable, and then waits until the named device's time for that step has passed
(:mod:`petals_chain.device_profile`, every duration × k). The step is the one the server actually ran: one session's
step over its span in PETALS' pool (``_MergedInferenceStep``), or b sessions' in our batching runtime
(``BatchedMergedInferenceStep``), so each kind of server keeps its own behaviour.

Consecutive steps are chained on a virtual device clock: a step that starts within ``CHAIN_GAP_S`` of the previous
one's deadline starts at that deadline, so the sleep's own overshoot does not accumulate over a busy stretch. Attention
runs fused (server/fused_attention.py), so that the real step stays below the device's. A step
is *valid* when its real compute ended before its device time; each step's real and device time go to the log, and
the share of valid steps is what decides whether a run may be reported (docs/testbed.md, "Emulated devices").
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from petals_chain.device_profile import DeviceProfile, device

DEVICE_ENV = "PETALS_CHAIN_DEVICE"
DILATION_ENV = "PETALS_CHAIN_TIME_DILATION"
LOG_ENV = "PETALS_CHAIN_DEVICE_LOG"
CHAIN_GAP_S = 0.002
LOG_HEADER = "t_s,blocks,sessions,tokens,context,real_s,device_s\n"


@dataclass(frozen=True)
class ClockSettings:
    """What the environment asks for: the device, the time dilation k and where the step log goes."""

    device: str
    dilation: float = 1.0
    log_path: str = ""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ClockSettings | None:
        """None when no device is named; ValueError with one line naming the variable when a value is bad."""
        env = os.environ if env is None else env
        name = env.get(DEVICE_ENV, "").strip()
        if not name:
            return None
        device(name)  # SpecError (a ValueError) naming the known devices
        raw = env.get(DILATION_ENV, "1")
        try:
            k = float(raw)
        except ValueError:
            raise ValueError(f"{DILATION_ENV}={raw!r} is not a number") from None
        if not k >= 1:
            raise ValueError(f"{DILATION_ENV}={raw!r} must be >= 1 (every device time and delay × k)")
        return cls(name, k, env.get(LOG_ENV, ""))


class DeviceClock:
    """The virtual clock of one emulated device: runs a step, waits out its device time, counts and logs it."""

    def __init__(self, profile: DeviceProfile, log_path: str = "", *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.profile = profile
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._deadline = -1.0
        self.steps = 0
        self.valid = 0
        self.real_s = 0.0
        self.device_s = 0.0
        self._log = None
        if log_path:
            self._log = open(log_path, "a", buffering=1)  # noqa: SIM115 (lives as long as the server)
            if self._log.tell() == 0:
                self._log.write(LOG_HEADER)

    @property
    def valid_share(self) -> float:
        """Share of the steps whose real compute ended before their device time (1.0 before any step)."""
        return self.valid / self.steps if self.steps else 1.0

    def run(self, blocks: int, new_tokens: Sequence[int], contexts: Sequence[int], fn: Callable[[], Any]) -> Any:
        """``fn()`` (the real step), then sleep until the step's device time has passed on the virtual clock."""
        with self._lock:
            start = self._clock()
            base = self._deadline if 0.0 <= start - self._deadline < CHAIN_GAP_S else start
            out = fn()
            end = self._clock()
            need = self.profile.step_s(blocks, new_tokens, contexts)
            real = end - start
            self._deadline = base + need
            self.steps += 1
            self.valid += real <= need
            self.real_s += real
            self.device_s += need
            if self._log is not None:
                self._log.write(f"{start:.6f},{blocks},{len(new_tokens)},{sum(new_tokens)},{sum(contexts)},"
                                f"{real:.6f},{need:.6f}\n")
            wait = self._deadline - self._clock()
            if wait > 0:
                self._sleep(wait)
            return out


def _merged_shape(hidden_states: Any, infos: Sequence[Any]) -> tuple[int, list[int], list[int]]:
    """(blocks, new tokens per hypothesis row, context per row) of PETALS' one-session step."""
    rows, n = int(hidden_states.shape[0]), int(hidden_states.shape[1])
    return len(infos), [n] * rows, [int(infos[0].prefix_length)] * rows


def _batched_shape(requests: Sequence[tuple[Any, Any, Sequence[Any]]]) -> tuple[int, list[int], list[int]]:
    """(blocks, new tokens per session row, context per row) of our batched step of several sessions."""
    tokens: list[int] = []
    contexts: list[int] = []
    for hidden_states, _, infos in requests:
        rows, n = int(hidden_states.shape[0]), int(hidden_states.shape[1])
        tokens += [n] * rows
        contexts += [int(infos[0].prefix_length)] * rows
    return len(requests[0][2]), tokens, contexts


CLOCK: DeviceClock | None = None  # the process's device (one per server process)


def install(settings: ClockSettings) -> DeviceClock:
    """Put this process's steps on the emulated device's clock: PETALS' one-session step and our batched step."""
    global CLOCK
    from petals.server.backend import _MergedInferenceStep

    from petals_chain.server.batched_step import BatchedMergedInferenceStep

    CLOCK = DeviceClock(device(settings.device).dilated(settings.dilation), settings.log_path)
    from petals_chain.server import fused_attention

    fused_attention.install()  # the same attention in a fraction of the CPU time: the step stays below the device's

    def merged(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def call(self: Any, hidden_states: Any, hypo_ids: Any, inference_infos: Any, *prompts: Any) -> Any:
            """PETALS' step of one session, on the device's clock."""
            if not inference_infos or hidden_states.numel() == 0:
                return original(self, hidden_states, hypo_ids, inference_infos, *prompts)
            blocks, tokens, contexts = _merged_shape(hidden_states, inference_infos)
            return CLOCK.run(blocks, tokens, contexts,
                             lambda: original(self, hidden_states, hypo_ids, inference_infos, *prompts))
        return call

    def batched(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def call(self: Any, requests: Any) -> Any:
            """Our step of several sessions, on the device's clock."""
            if not requests:
                return original(self, requests)
            blocks, tokens, contexts = _batched_shape(requests)
            return CLOCK.run(blocks, tokens, contexts, lambda: original(self, requests))
        return call

    for cls, wrap in ((_MergedInferenceStep, merged), (BatchedMergedInferenceStep, batched)):
        if not getattr(cls.__call__, "_petals_chain_device", False):
            wrapped = wrap(cls.__call__)
            wrapped._petals_chain_device = True  # type: ignore[attr-defined]
            cls.__call__ = wrapped
    return CLOCK


def read_log(path: str | os.PathLike[str]) -> dict[str, float]:
    """Summary of a step log: steps, the valid share, real and device seconds in all, the worst real/device ratio."""
    import csv

    with open(path, newline="") as f:
        rows = [(float(r["real_s"]), float(r["device_s"])) for r in csv.DictReader(f)]
    if not rows:
        return {"steps": 0, "valid_share": float("nan"), "real_s": 0.0, "device_s": 0.0, "worst_ratio": float("nan")}
    valid = sum(real <= need for real, need in rows)
    return {"steps": len(rows), "valid_share": valid / len(rows), "real_s": sum(r for r, _ in rows),
            "device_s": sum(d for _, d in rows), "worst_ratio": max(r / d for r, d in rows if d > 0)}
