"""A swarm run the way a PETALS user runs one: the model by its Hugging Face repository name (from a local cache,
offline), PETALS' own server flags, a token from the environment, and a client that is given only the URL.

One SmolLM2-135M server holds the whole model; it is started with --num_handlers, --max_batch_size and
--identity_path in PETALS' spelling. Nothing is mocked: the orchestrator sizes the model from the checkpoint,
the server's peer id is the identity file's, and the client's greedy text is local transformers' token for token.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from petals_chain.checkpoint.resolve import seed_hub_cache
from petals_chain.checkpoint.sizing import block_sizes
from petals_chain.loopback.swarm import LocalSwarm, ServerPlan

REPO = Path(__file__).resolve().parents[2]
SMOL = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
REPO_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TOKEN = "adopt-test-token"
MAX_LENGTH = 256

pytestmark = pytest.mark.skipif(not (SMOL / "model.safetensors").is_file(), reason="needs scripts/prepare_model.sh")


@pytest.fixture(scope="module")
def hub_env(tmp_path_factory: pytest.TempPathFactory):
    """SmolLM2 in a temporary Hugging Face cache under its repository name; offline; the token in the environment."""
    cache = tmp_path_factory.mktemp("hf") / "hub"
    seed_hub_cache(SMOL, REPO_ID, cache)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_CACHE", str(cache))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("PETALS_CHAIN_ORCH_TOKEN", TOKEN)
        yield cache


@pytest.fixture(scope="module")
def identity(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A p2p private key file and the peer id it stands for."""
    from hivemind.p2p import P2P, PeerID

    path = tmp_path_factory.mktemp("identity") / "server.id"
    P2P.generate_identity(str(path))
    return path, PeerID.from_identity(path.read_bytes()).to_base58()


@pytest.fixture(scope="module")
def swarm(hub_env: Path, identity: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory):
    """Orchestrator sized by --model REPO_ID (token required) + one server given PETALS' flags."""
    plan = ServerPlan("whole", "700MB", ("--num_handlers", "2", "--max_batch_size", "512",
                                        "--identity_path", str(identity[0]), "--tau-p", "20ms"))
    sw = LocalSwarm(REPO_ID, [plan], log_dir=tmp_path_factory.mktemp("adopt-logs"), model_name=REPO_ID,
                    max_length=MAX_LENGTH, arrival_rate=0.5, c=2, size_from_model=True, token=TOKEN)
    try:
        sw.start(timeout_s=400)
        yield sw
    finally:
        sw.stop()


def test_server_with_petals_flags_serves_under_its_identity_files_peer_id(swarm: LocalSwarm, identity) -> None:
    """The orchestrator composed for the checkpoint's own sizes; the server registered under the identity's peer id."""
    want = block_sizes(SMOL, "float32", MAX_LENGTH)
    health = swarm.get("/health")
    assert health["model"] == {"name": REPO_ID, "num_blocks": 30, "block_bytes": want.block_bytes,
                               "cache_bytes": want.cache_bytes}
    (rec,) = swarm.get("/servers")["servers"]
    assert rec["peer_id"] == identity[1]
    assert rec["serving"] == {"start": 0, "end": 30}
    assert swarm.get("/swarm")["model"]["source"] == REPO_ID


def test_a_client_given_only_the_url_generates_the_local_models_text(swarm: LocalSwarm) -> None:
    """No model path, no peers, no token argument: all from GET /swarm and the environment. Greedy output equals
    local transformers' token for token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client

    tok = AutoTokenizer.from_pretrained(str(SMOL))
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt")
    local = AutoModelForCausalLM.from_pretrained(str(SMOL)).eval()
    with torch.no_grad():
        want = local.generate(ids, max_new_tokens=8, do_sample=False)[0].tolist()
    model = AutoDistributedModelForCausalLM.from_pretrained(orchestrator=swarm.url, lease_timeout_s=120.0)
    try:
        assert model.config.num_hidden_layers == 30
        with torch.no_grad():
            got = model.generate(ids, max_new_tokens=8, do_sample=False)[0].tolist()
    finally:
        close_client(model)
    assert got == want
    assert "Paris" in tok.decode(got[ids.shape[1]:], skip_special_tokens=True)
