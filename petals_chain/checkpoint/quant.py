"""Bytes of a block's parameters as a PETALS server holds them: plain dtype, LLM.int8 or NF4 (docs/petals.md, "Sizing").

PETALS quantises every ``nn.Linear`` weight of a block with bitsandbytes (``--quant_type``)
and keeps everything else (biases, norms) in the compute dtype. The layouts counted here
are bitsandbytes' own:

* int8 (LLM.int8, ``Int8Params`` without fp16 weights): one byte per weight plus one float32
  scale per output row;
* nf4 (``Params4bit``, block size 64, double quantisation as PETALS enables it): two weights per
  byte, one uint8 absmax per 64 weights, one float32 second-level absmax per 256 first-level
  ones, one float32 offset and the 16-value float32 NF4 code per weight tensor (the 256-value
  dynamic map of the second level is shared by every tensor of the process and not counted).

Pure arithmetic, so it is checked on a CPU where bitsandbytes cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from petals_chain.model import SpecError

QUANT_TYPES = ("none", "int8", "nf4")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # one value of each compute dtype a server may hold
FLOAT32_BYTES = DTYPE_BYTES["float32"]
NF4_BLOCK = 64  # weights per first-level absmax (PETALS' blocksize)
NF4_NESTED_BLOCK = 256  # first-level absmaxes per second-level float32 absmax (bitsandbytes' double quantisation)
NF4_CODE_VALUES = 16  # the NF4 lookup table each quantised tensor carries, float32


@dataclass(frozen=True)
class BlockParams:
    """What fixes a block's parameter bytes: each linear weight's (out, in), and every other parameter's count."""

    linear_shapes: tuple[tuple[int, int], ...]
    other_params: int  # biases, norm weights, anything PETALS leaves unquantised (held in the compute dtype)

    @property
    def num_params(self) -> int:
        """All parameters of the block."""
        return sum(o * i for o, i in self.linear_shapes) + self.other_params


def check_quant_type(quant_type: str) -> str:
    """A quantisation PETALS knows (``--quant_type``); SpecError naming the choices otherwise."""
    if quant_type not in QUANT_TYPES:
        raise SpecError(f"--quant_type must be one of {', '.join(QUANT_TYPES)}, got {quant_type!r}")
    return quant_type


def _ceil_div(a: int, b: int) -> int:
    """⌈a/b⌉ for non-negative integers."""
    return -(-a // b)


def linear_weight_bytes(out_features: int, in_features: int, quant_type: str, dtype_bytes: int) -> int:
    """Bytes of one linear layer's weight (no bias) as bitsandbytes stores it for ``quant_type``."""
    n = out_features * in_features
    if check_quant_type(quant_type) == "none":
        return n * dtype_bytes
    if quant_type == "int8":
        return n + out_features * FLOAT32_BYTES
    absmax = _ceil_div(n, NF4_BLOCK)
    nested = _ceil_div(absmax, NF4_NESTED_BLOCK) * FLOAT32_BYTES
    return _ceil_div(n, 2) + absmax + nested + FLOAT32_BYTES + NF4_CODE_VALUES * FLOAT32_BYTES


def block_param_bytes(params: BlockParams, dtype_bytes: int, quant_type: str = "none") -> int:
    """s_m: the linear weights as ``quant_type`` stores them plus the other parameters in the compute dtype."""
    linear = sum(linear_weight_bytes(o, i, quant_type, dtype_bytes) for o, i in params.linear_shapes)
    return linear + params.other_params * dtype_bytes


def count_block_params(block: Any) -> BlockParams:
    """The BlockParams of a torch block (empty weights suffice): its ``nn.Linear`` weights and the rest."""
    import torch

    linear_ids = set()
    shapes = []
    for module in block.modules():
        if isinstance(module, torch.nn.Linear):
            linear_ids.add(id(module.weight))
            shapes.append((module.out_features, module.in_features))
    other = sum(p.numel() for p in block.parameters() if id(p) not in linear_ids)
    return BlockParams(tuple(shapes), int(other))
