"""The orchestrator sized from a checkpoint (--model), and GET /swarm: all a client needs (DHT peers, the model)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from petals_chain.checkpoint.sizing import block_sizes
from petals_chain.model import SpecError
from petals_chain.orchestrator.cli import build_orchestrator, parse_args
from petals_chain.protocol.http_client import OrchestratorClient, OrchestratorError
from tests.orchestrator.test_orchestrator import serving

REPO = Path(__file__).resolve().parents[2]
SMOL = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
PEERS = ["/ip4/127.0.0.1/tcp/4001/p2p/QmTestPeer"]
needs_smol = pytest.mark.skipif(not (SMOL / "config.json").is_file(), reason="needs scripts/prepare_model.sh")


@needs_smol
def test_model_sizes_come_from_the_checkpoint_dtype_quantisation_and_length() -> None:
    orch, _ = build_orchestrator(parse_args(["--model", str(SMOL), "--torch_dtype", "bfloat16", "--max-length", "512"]))
    want = block_sizes(SMOL, "bfloat16", 512)
    m = orch.registry.model
    assert (m.num_blocks, m.block_bytes, m.cache_bytes, m.name) == (30, want.block_bytes, want.cache_bytes,
                                                                    "SmolLM2-135M-Instruct")
    assert want.block_bytes == 7_080_192 and want.cache_bytes == 2 * 576 // 3 * 512 * 2
    assert orch.model_source == {"source": str(SMOL.resolve()), "torch_dtype": "bfloat16", "quant_type": "none",
                                 "max_length": 512}
    nf4, _ = build_orchestrator(parse_args(["--model", str(SMOL), "--quant_type", "nf4", "--max-length", "512"]))
    assert nf4.registry.model.block_bytes == block_sizes(SMOL, "float32", 512, "nf4").block_bytes < m.block_bytes


@needs_smol
def test_explicit_sizes_override_the_checkpoint_and_contradictions_are_refused() -> None:
    orch, _ = build_orchestrator(parse_args(["--model", str(SMOL), "--block-bytes", "20MB", "--model-name", "smol"]))
    assert orch.registry.model.block_bytes == 20e6 and orch.registry.model.name == "smol"
    with pytest.raises(SpecError, match="--model-blocks 12 contradicts --model"):
        build_orchestrator(parse_args(["--model", str(SMOL), "--model-blocks", "12"]))
    with pytest.raises(SpecError, match="give --model or --cluster, not both"):
        build_orchestrator(parse_args(["--model", str(SMOL), "--cluster", "experiments/clusters/paper_default.yaml"]))


@needs_smol
def test_get_swarm_gives_the_dht_and_the_model_and_needs_the_token() -> None:
    orch, _ = build_orchestrator(parse_args(["--model", str(SMOL), "--max-length", "256"]),
                                 dht_info={"initial_peers": PEERS, "dht_prefix": "SmolLM2-135M-Instruct"})

    async def body() -> None:
        async with serving(orch, token="s3cret") as url:
            async with aiohttp.ClientSession() as http, http.get(url + "/swarm") as r:
                assert r.status == 401
            async with OrchestratorClient(url, token="s3cret") as c:
                swarm = await c.swarm()
        assert swarm["initial_peers"] == PEERS and swarm["dht_prefix"] == "SmolLM2-135M-Instruct"
        assert swarm["model"] == {"name": "SmolLM2-135M-Instruct", "num_blocks": 30, "source": str(SMOL.resolve()),
                                  "torch_dtype": "float32", "quant_type": "none", "max_length": 256}

    asyncio.run(body())


def test_get_swarm_without_a_dht_or_a_checkpoint_says_so_by_empty_fields() -> None:
    orch, _ = build_orchestrator(parse_args(["--model-blocks", "4", "--block-bytes", "1GB", "--cache-bytes", "0.1GB"]))

    async def body() -> None:
        async with serving(orch) as url, OrchestratorClient(url) as c:
            swarm = await c.swarm()
            assert swarm == {"initial_peers": [], "dht_prefix": None, "model": {"name": "model", "num_blocks": 4}}
            with pytest.raises(OrchestratorError):
                await c._call("GET", "/swarms")

    asyncio.run(body())
