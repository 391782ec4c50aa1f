"""The memory model of a real checkpoint (paper §2.1): s_m, s_c, cache slots, the runtime reserve, a measured τp.

A PETALS server and the orchestrator must agree on ``s_m`` (bytes of one block's
parameters in the serving dtype and quantisation, checkpoint.quant) and ``s_c`` (KV-cache
bytes of one block for one job of ``max_length`` tokens, PETALS' own formula), so both come
from here. The model is a directory or a Hugging Face repository name (checkpoint.resolve).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from petals_chain import defaults
from petals_chain.checkpoint.quant import DTYPE_BYTES, block_param_bytes, check_quant_type, count_block_params
from petals_chain.compose.capacity import slots_left
from petals_chain.checkpoint.resolve import ModelDirError, resolve_model
from petals_chain.model import ModelSpec, SpecError
from petals_chain.units import UnitError, parse_size

DTYPE_CHOICES = ("auto", *DTYPE_BYTES)  # "auto": the checkpoint's own dtype, bfloat16 for float32 ones (as PETALS)
MIN_PLAUSIBLE_BUDGET_BYTES = 1e6  # under 1 MB is a typo (missing unit), not a server
MAX_PLAUSIBLE_BUDGET_BYTES = defaults.MAX_MEMORY_BYTES  # the same limit the orchestrator's registry applies


@dataclass(frozen=True)
class BlockSizes:
    """Sizes of one transformer block of a checkpoint in a dtype, for jobs of at most max_length tokens."""

    num_blocks: int
    block_bytes: int  # s_m
    cache_bytes: int  # s_c: 2 · hidden / kv_groups · max_length · dtype bytes
    max_length: int
    dtype: str
    activation_bytes_per_token: int = 0  # transient bytes of one prefill token in one block: (3·d_ff + 8·d)·dtype
    quant_type: str = "none"  # how the linear weights are stored (checkpoint.quant); the cache stays in ``dtype``
    # bytes one cache slot really allocates when block/cache bytes are an emulated device's units (0: cache_bytes)
    real_cache_bytes: int = 0

    @property
    def cache_alloc_bytes(self) -> int:
        """Bytes one cache slot allocates on this process's device (``cache_bytes`` unless emulated units)."""
        return self.real_cache_bytes or self.cache_bytes

    def emulated(self, block_bytes: int, cache_bytes: int) -> BlockSizes:
        """These sizes counted in an emulated device's units (the blocks and slots of the model it stands for), the
        allocation staying this checkpoint's (server/device_clock.py)."""
        from dataclasses import replace

        return replace(self, block_bytes=int(block_bytes), cache_bytes=int(cache_bytes),
                       real_cache_bytes=self.cache_alloc_bytes)

    def model_spec(self, name: str) -> ModelSpec:
        """The ModelSpec the orchestrator composes with."""
        return ModelSpec(self.num_blocks, float(self.block_bytes), float(self.cache_bytes), name)

    def cache_slots(self, memory_bytes: float, num_blocks: int) -> int:
        """M̃_j = ⌊(M_j − s_m·m_j) / s_c⌋: block-job cache slots left after holding num_blocks blocks.

        The orchestrator's own count (compose.capacity.slots_left, one rounding rule), so a server never sizes its
        cache a slot apart from what the composition assumed; negative when the blocks alone exceed memory_bytes.
        """
        return slots_left(memory_bytes, self.block_bytes, self.cache_bytes, num_blocks)

    def runtime_reserve_bytes(self, device: str) -> int:
        """O_j: what a server process needs beyond s_m·m_j + s_c·slots, to subtract from its budget on a GPU.

        Measured on an H100 (results/gpu/README.md): the weights and the static cache take exactly
        s_m·m_j + s_c·slots, but the process also holds the CUDA context (~0.7 GiB) and a prefill's activations,
        about (3·d_ff + 8·d)·dtype bytes per token, plus allocator slack. PETALS runs one session's prefill at a
        time, so the largest activation is one job of ``max_length`` tokens. On a CPU the budget is the operator's
        own figure for blocks + cache (the emulated testbeds size it so), so nothing is reserved there.
        """
        if not device.startswith("cuda"):
            return 0
        activations = self.activation_bytes_per_token * self.max_length * (1.0 + defaults.ALLOCATOR_SLACK)
        return int(defaults.CUDA_CONTEXT_BYTES + activations)


def check_dtype(dtype: str) -> str:
    """A serving dtype name this module knows the width of."""
    if dtype not in DTYPE_BYTES:
        raise SpecError(f"torch dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    return dtype


def resolve_dtype(config, dtype: str) -> str:
    """``--torch_dtype``: a dtype name as is; 'auto' as PETALS reads it (the checkpoint's, bfloat16 if float32)."""
    if dtype != "auto":
        return check_dtype(dtype)
    own = str(getattr(config, "torch_dtype", None) or "auto").removeprefix("torch.")
    return own if own in DTYPE_BYTES and own != "float32" else "bfloat16"


def check_max_length(max_length: int) -> int:
    """Tokens per job (prompt + generated), the length each job's KV cache is sized for."""
    if isinstance(max_length, bool) or not isinstance(max_length, int) or not 1 <= max_length <= 1_000_000:
        raise SpecError(f"max_length must be an integer in [1, 1000000] tokens, got {max_length!r}")
    return max_length


def _size_option(option: str, text: str) -> float:
    """Bytes of a size option's value (petals_chain.units); SpecError naming the option and showing examples."""
    try:
        return parse_size(text)
    except UnitError as exc:
        raise SpecError(f"{option} {text!r} is not a size (examples: 20GB, 512MB, 1.5GiB): {exc}") from None


def parse_budget(text: str) -> float:
    """'20GB', '512MB', '1.5GiB' or plain bytes → bytes (petals_chain.units); SpecError on nonsense or absurd sizes."""
    value = _size_option("--memory-budget", text)
    if not math.isfinite(value) or value < MIN_PLAUSIBLE_BUDGET_BYTES:
        raise SpecError(f"--memory-budget {text!r} = {value:g} bytes is absurdly small (did you forget the unit?)")
    if value > MAX_PLAUSIBLE_BUDGET_BYTES:
        raise SpecError(f"--memory-budget {text!r} = {value:g} bytes is absurdly large (max 1 PB)")
    return value


def parse_reserve(text: str) -> float:
    """``--reserve SIZE``: a non-negative size with a unit (``0``, ``1.5GiB``); SpecError naming the option."""
    value = _size_option("--reserve", text)
    if value < 0:
        raise SpecError(f"--reserve must be >= 0, got {text!r}")
    return value


def load_config(model_dir: str | Path):
    """The PETALS distributed config of a checkpoint directory or repository name (block class, layers, widths)."""
    from petals.utils.auto_config import AutoDistributedConfig

    path = resolve_model(model_dir)
    try:
        return AutoDistributedConfig.from_pretrained(str(path))
    except ValueError as exc:  # unsupported model_type and the like
        raise ModelDirError(f"model directory {str(path)!r}: {exc}") from None


def block_sizes(model_dir: str | Path, dtype: str = "float32", max_length: int = defaults.MAX_LENGTH,
                quant_type: str = "none") -> BlockSizes:
    """s_m and s_c of a checkpoint (a directory or a repository name): one block's parameters (counted on empty
    weights, linears stored as ``quant_type``) and PETALS' cache formula; ``dtype`` may be 'auto'."""
    from accelerate import init_empty_weights

    if dtype not in DTYPE_CHOICES:
        raise SpecError(f"torch dtype must be one of {', '.join(DTYPE_CHOICES)}, got {dtype!r}")
    check_quant_type(quant_type)
    check_max_length(max_length)
    config = load_config(model_dir)
    dtype = resolve_dtype(config, dtype)
    with init_empty_weights(include_buffers=True):
        params = count_block_params(config.block_class(config))
    width = DTYPE_BYTES[dtype]
    kv_groups = getattr(config, "num_key_value_groups", 1) or 1
    cache_values = 2 * config.hidden_size * max_length // kv_groups
    d_ff = getattr(config, "intermediate_size", None) or 4 * config.hidden_size
    return BlockSizes(config.num_hidden_layers, block_param_bytes(params, width, quant_type), int(cache_values * width),
                      max_length, dtype, activation_bytes_per_token=(3 * d_ff + 8 * config.hidden_size) * width,
                      quant_type=quant_type)


def measure_tau_p(
    model_dir: str | Path,
    dtype: str = "float32",
    input_tokens: int = defaults.JOB_INPUT_TOKENS,
    output_tokens: int = defaults.JOB_OUTPUT_TOKENS,
    repeats: int = 3,
) -> float:
    """Measured τp: seconds one block of this checkpoint takes for one job (prefill + decode steps), median of repeats.

    Runs a block of the checkpoint's architecture (random weights: the cost does not depend on
    the values) on this machine: a prefill of ``input_tokens`` then ``output_tokens − 1`` one-token
    steps against the growing KV cache, as PETALS' inference does.
    """
    import torch

    if input_tokens < 1 or output_tokens < 1:
        raise SpecError("measure_tau_p: input_tokens and output_tokens must be >= 1")
    config = load_config(model_dir)
    torch_dtype = getattr(torch, check_dtype(dtype))
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        block = config.block_class(config).to(torch_dtype).eval()
        prompt = torch.randn(1, input_tokens, config.hidden_size, generator=gen).to(torch_dtype)
        step = torch.randn(1, 1, config.hidden_size, generator=gen).to(torch_dtype)
        block(prompt, use_cache=True)  # warm-up: first-call allocations are not service time
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _, cache = block(prompt, use_cache=True)
            for _ in range(output_tokens - 1):
                _, cache = block(step, use_cache=True, layer_past=cache)
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]
