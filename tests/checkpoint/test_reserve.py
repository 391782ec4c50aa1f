"""The runtime reserve a GPU server keeps out of its budget (CUDA context + prefill activations), measured on an H100.

results/gpu/README.md: weights + static cache take exactly s_m·m + s_c·slots, but the process also holds ~0.67 GiB of
CUDA context and ≈ 130 kB per prefill token for LLaMA-2-7B in bf16; ``--reserve auto`` keeps that out of M_j.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from petals_chain import defaults
from petals_chain.checkpoint.sizing import BlockSizes, block_sizes, parse_reserve
from petals_chain.loopback.swarm import write_tiny_llama
from petals_chain.model import SpecError

REPO = Path(__file__).resolve().parents[2]


def llama2_7b(max_length: int = 2048) -> BlockSizes:
    """LLaMA-2-7B in fp16 (d = 4096, d_ff = 11008), as block_sizes would give it."""
    return BlockSizes(32, 404_766_720, 2 * 4096 * max_length * 2, max_length, "float16",
                      activation_bytes_per_token=(3 * 11008 + 8 * 4096) * 2)


def test_activation_term_matches_the_h100_measurement() -> None:
    sizes = llama2_7b()
    assert 125e3 < sizes.activation_bytes_per_token < 135e3  # measured ≈ 130 kB per session-token
    reserve = sizes.runtime_reserve_bytes("cuda:0")
    expected = defaults.CUDA_CONTEXT_BYTES + sizes.activation_bytes_per_token * 2048 * (1 + defaults.ALLOCATOR_SLACK)
    assert reserve == int(expected)
    assert 0.9e9 < reserve < 1.2e9  # ≈ 0.7 GiB context + ≈ 0.3 GB for one 2048-token prefill
    assert sizes.runtime_reserve_bytes("cuda") == reserve
    assert sizes.runtime_reserve_bytes("cpu") == 0  # a CPU budget is the operator's figure for blocks + cache


def test_reserve_grows_with_the_longest_prefill() -> None:
    assert llama2_7b(4096).runtime_reserve_bytes("cuda") > llama2_7b(2048).runtime_reserve_bytes("cuda")


def test_block_sizes_read_the_activation_width_from_the_config(tmp_path: Path) -> None:
    sizes = block_sizes(write_tiny_llama(tmp_path / "tiny", hidden=128), "float32", 256)
    assert sizes.activation_bytes_per_token == (3 * 256 + 8 * 128) * 4  # d_ff = 2·hidden in the tiny model


def test_parse_reserve() -> None:
    assert parse_reserve("0") == 0 and parse_reserve("1.5GiB") == 1.5 * 2**30
    for bad in ("-1GB", "lots", "nan"):
        with pytest.raises(SpecError, match="--reserve"):
            parse_reserve(bad)


def test_server_refuses_a_reserve_that_leaves_no_room(tmp_path: Path) -> None:
    """The budget less the reserve must hold a block and a slot; the error names both, before any connection."""
    model = write_tiny_llama(tmp_path / "tiny", hidden=128)
    run = subprocess.run(
        [sys.executable, "-m", "petals_chain.server", str(model), "--orchestrator", "http://127.0.0.1:9",
         "--memory-budget", "3MB", "--reserve", "2.9MB", "--max-length", "256"],
        capture_output=True, text=True, cwd=REPO, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert run.returncode == 2, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "--reserve" in last and "cannot hold one block" in last, run.stderr
