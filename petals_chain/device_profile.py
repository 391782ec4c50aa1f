"""Step time of a named GPU (or MIG slice) serving LLaMA-2-7B-shaped blocks: what an emulated server waits for.

One step of a server runs its span of blocks once over the new tokens of ``b`` sessions (one session in PETALS'
pool; several in our batching runtime). Per block, with session i bringing ``n_i`` new tokens on top of ``c_i``
cached ones, the model is a roofline with a host floor:

    τ_block = max( host(b),  t_in · Σ n_i,  w + kv · Σ (c_i + n_i) )
    host(b) = h0 + h1 · (b − 1)

* ``host``: launching a block's ~25 kernels from Python (eager PyTorch), which a fast GPU waits for on a decode
  step (H100: 0.37 ms per block eager against 0.23 ms replayed from a CUDA graph); ``h1`` is what each further
  session adds to our batched step (its attention's launches);
* ``t_in · Σ n``: the compute-bound part (prefill), per token of all sessions;
* ``w + kv · Σ context``: the memory-bound part (decode): the block's weights read once per step plus every
  session's cached keys and values.

The constants are fitted (``python -m petals_chain.experiments.device_fit``) on an H100 (``results/gpu``: eager and
CUDA-graph decode steps of 1–16 sessions at 128–4000 tokens of context, prefills of 128–4096 tokens) and on an H200
(``results/gpu-batched``: our batched arena step of 1–32 sessions, for ``h1``). A MIG slice of an A100 is derived
from the H100 by its shares: the compute term scales with dense FLOP/s (the A100's 312 TFLOP/s times the slice's
share of its 108 SMs, 14 per compute slice), the memory terms with bandwidth (the A100-80GB's 2.039 TB/s times the
slice's memory slices out of 8), both at the efficiency measured on the H100; the host terms stay (same host code).
Memory is the slice's (40 / 20 GB), accounted in LLaMA-2-7B units (``model``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from petals_chain.model import SpecError
from petals_chain.model_shapes import PAPER_TESTBED_CACHE_TOKENS, block_and_cache_bytes, known_shape

# Reference chip the constants were measured on, and the A100-80GB the paper's slices are cut from (datasheets).
H100_TFLOPS, H100_TBPS = 989.4, 3.35
A100_TFLOPS, A100_TBPS, A100_SMS, SMS_PER_COMPUTE_SLICE, MEMORY_SLICES = 312.0, 2.039, 108, 14, 8

# Fitted on the measurements named in the module docstring (experiments/device_fit.py prints and checks them).
H100_HOST_S = 3.6875e-04  # h0: eager decode step of one block, host-bound on the H100
BATCH_HOST_S = 4.9698e-06  # h1: each further session of our batched arena step (H200)
H100_T_IN_S = 8.9066e-07  # t_in: per prompt token and block (prefills of 512–4096 tokens)
H100_WEIGHTS_S = 2.3065e-04  # w: one block's weights per step (CUDA-graph decode, context → 0)
H100_KV_S = 6.1084e-09  # kv: per cached token of every session (CUDA-graph decode, 1–16 sessions)

EMULATED_MODEL = "llama-2-7b"
EMULATED_DTYPE = "float16"


@dataclass(frozen=True)
class DeviceProfile:
    """A device's step-time constants (seconds per block) and memory; :meth:`block_step_s` is the model."""

    name: str
    memory_bytes: float
    host_s: float
    batch_host_s: float
    t_in_s: float
    weights_s: float
    kv_s: float
    model: str = EMULATED_MODEL

    def block_step_s(self, new_tokens: Sequence[int], contexts: Sequence[int]) -> float:
        """Seconds one block takes for one step of sessions with these new tokens and cached contexts."""
        if len(new_tokens) != len(contexts) or not new_tokens:
            raise SpecError("a step needs one (new tokens, context) pair per session, at least one session")
        b = len(new_tokens)
        tokens = sum(int(n) for n in new_tokens)
        context = sum(int(c) + int(n) for n, c in zip(new_tokens, contexts))
        host = self.host_s + self.batch_host_s * (b - 1)
        return max(host, self.t_in_s * tokens, self.weights_s + self.kv_s * context)

    def step_s(self, blocks: int, new_tokens: Sequence[int], contexts: Sequence[int]) -> float:
        """Seconds a span of ``blocks`` blocks takes for one step (every block does the same work)."""
        return blocks * self.block_step_s(new_tokens, contexts)

    def job_s(self, input_tokens: float, output_tokens: float, sessions: int = 1) -> float:
        """Per block: ``sessions`` jobs of this shape started together, prefills one after another, decodes batched
        (all finish together); the paper's τp for sessions = 1."""
        if sessions < 1 or input_tokens < 1 or output_tokens < 1:
            raise SpecError("job_s: sessions, input_tokens and output_tokens must be >= 1")
        l_in, steps = int(round(input_tokens)), max(0, int(round(output_tokens)) - 1)
        prefill = self.block_step_s([l_in], [0])
        mid = l_in + steps / 2.0
        decode = self.block_step_s([1] * sessions, [int(round(mid))] * sessions)
        return sessions * prefill + steps * decode

    def batch_slowdown(self, input_tokens: float, output_tokens: float, max_sessions: int) -> tuple[float, ...]:
        """g(b) = τp(b)/τp(1) for b = 1..max_sessions (ServerSpec.batch_slowdown): the composer's view of this device
        with a batching server; a server of one session at a time has g(b) = b (use serial_fraction = 1)."""
        one = self.job_s(input_tokens, output_tokens, 1)
        return tuple(self.job_s(input_tokens, output_tokens, b) / one for b in range(1, max_sessions + 1))

    def dilated(self, k: float) -> DeviceProfile:
        """The same device with every duration × k (a run whose clock is dilated by k)."""
        if not k > 0:
            raise SpecError(f"time dilation must be > 0, got {k!r}")
        return replace(self, host_s=self.host_s * k, batch_host_s=self.batch_host_s * k, t_in_s=self.t_in_s * k,
                       weights_s=self.weights_s * k, kv_s=self.kv_s * k)


def h100() -> DeviceProfile:
    """The H100 the constants were measured on (80 GB)."""
    return DeviceProfile("h100", 80e9, H100_HOST_S, BATCH_HOST_S, H100_T_IN_S, H100_WEIGHTS_S, H100_KV_S)


def a100_mig(compute_slices: int, memory_slices: int, memory_gb: float) -> DeviceProfile:
    """A MIG slice of an A100-80GB: compute and bandwidth shares of the A100, at the H100's measured efficiency."""
    if not 1 <= compute_slices <= 7 or not 1 <= memory_slices <= MEMORY_SLICES:
        raise SpecError(f"MIG slice {compute_slices}g with {memory_slices} memory slices does not exist")
    tflops = A100_TFLOPS * compute_slices * SMS_PER_COMPUTE_SLICE / A100_SMS
    tbps = A100_TBPS * memory_slices / MEMORY_SLICES
    ref = h100()
    return replace(ref, name=f"a100-{compute_slices}g.{int(memory_gb)}gb", memory_bytes=memory_gb * 1e9,
                   t_in_s=ref.t_in_s * H100_TFLOPS / tflops, weights_s=ref.weights_s * H100_TBPS / tbps,
                   kv_s=ref.kv_s * H100_TBPS / tbps)


DEVICES: dict[str, DeviceProfile] = {
    "h100": h100(),
    "a100-3g.40gb": a100_mig(3, 4, 40),
    "a100-2g.20gb": a100_mig(2, 2, 20),
}


def device(name: str) -> DeviceProfile:
    """A named device profile; SpecError listing the known ones otherwise."""
    try:
        return DEVICES[name]
    except KeyError:
        raise SpecError(f"unknown device {name!r} (known: {', '.join(sorted(DEVICES))})") from None


def device_name(text: object) -> str:
    """The name of a known device (for option and file validators); SpecError, a ValueError, otherwise."""
    return device(str(text)).name


def emulated_sizes(max_length: int = PAPER_TESTBED_CACHE_TOKENS) -> tuple[int, int]:
    """(s_m, s_c) in bytes of the emulated model (LLaMA-2-7B in fp16, s_c for ``max_length`` tokens): the units an
    emulated server counts its memory in, whatever small model it computes with."""
    return block_and_cache_bytes(known_shape(EMULATED_MODEL), EMULATED_DTYPE, int(max_length))
