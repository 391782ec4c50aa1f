"""A tiny LLaMA-shaped checkpoint with LLaMA-2-7B's depth, for servers that emulate a GPU on a shared CPU.

An emulated server (server/device_clock.py) must finish each step's real compute before the device's time for it;
SmolLM2-135M's CPU time on two shared cores overruns an A100 slice's LLaMA-2-7B step many times over. This model keeps
what the swarm sees of LLaMA-2-7B (32 decoder blocks, multi-head attention, PETALS' LLaMA code path) with a width of
16 (one attention head of 16) and a 4096-token vocabulary (the client's output layer runs on every prompt position:
LLaMA-2's 32000 would cost the client 4 GFLOP per 2048-token prompt). A decode step of a block then costs ~0.25 ms of
CPU, a fraction of its device time; what is left is per-operation overhead, not arithmetic (a width of 64 cost 1.6×
as much). Every generated token stays checkable against local transformers. Weights are random with a fixed seed: the
same files on every machine.

``python -m petals_chain.checkpoint.tiny_llama DIR`` writes it (idempotent; prints DIR).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

TINY_CONFIG = {"hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 1, "num_key_value_heads": 1,
               "num_hidden_layers": 32, "vocab_size": 4096, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
               "tie_word_embeddings": False}
SEED = 7
NAME = "tiny-llama-32x16"


def write_tiny_llama(directory: str | Path, seed: int = SEED) -> Path:
    """Write the checkpoint (config.json + safetensors, fp32) into ``directory`` unless it is already there."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(directory)
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    torch.manual_seed(seed)
    config = LlamaConfig(**TINY_CONFIG, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # a wider spread than the default init, so greedy tokens differ from step to step
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.2)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Write the checkpoint to the directory given; print it."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.checkpoint.tiny_llama",
                                description=__doc__.splitlines()[0])
    p.add_argument("directory", type=Path)
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args(argv)
    print(write_tiny_llama(args.directory, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
