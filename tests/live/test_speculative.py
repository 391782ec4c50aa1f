"""Speculative decoding with rollback on a real swarm: SmolLM2-135M over two orchestrated servers.

Drafts are partly kept and partly rejected, so every server of the chain must roll its cache back many times; the
output must still be exactly what plain greedy decoding through the same swarm writes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from petals_chain.client.speculative import WidthError, open_speculative_session, speculative_generate
from petals_chain.loopback.swarm import LocalSwarm, ServerPlan, group_members

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
PROMPTS = [
    "Repeat the sentence exactly. Sentence: the quick brown fox jumps over the lazy dog near the river bank. "
    "Repeated: the quick brown",
    "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,",
]
SPEEDUP = (1.0, 1.3, 1.5, 1.6)  # the orchestrator's s(k) table (--speedup-profile)


@pytest.fixture(scope="module")
def swarm_model(tmp_path_factory: pytest.TempPathFactory):
    """Orchestrator (choosing widths by greedy(p*) from a speed-up table) + two servers of SmolLM2 (neither holds
    all 30 blocks) and the leasing client (which asks for no width)."""
    if not (SMOLLM2 / "model.safetensors").is_file():
        pytest.fail(f"{SMOLLM2} is missing: run scripts/prepare_model.sh")
    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client

    plans = [ServerPlan("a", "260MB"), ServerPlan("b", "260MB")]
    profile = tmp_path_factory.mktemp("profile") / "speedup.csv"
    profile.write_text("width,speedup,service_s\n" + "".join(f"{k},{s},30\n" for k, s in enumerate(SPEEDUP, 1)))
    with LocalSwarm(SMOLLM2, plans, log_dir=tmp_path_factory.mktemp("spec-logs"), model_name="SmolLM2-135M-Instruct",
                    max_length=256, arrival_rate=0.2,
                    orchestrator_args=("--width", "greedy-p", "--speedup-profile", str(profile))) as sw:
        sw.start(timeout_s=360)
        model = AutoDistributedModelForCausalLM.from_pretrained(str(SMOLLM2), orchestrator=sw.url)
        try:
            yield sw, model
        finally:
            close_client(model)
    assert all(not group_members(pg) for pg in sw.started_pgids)


def test_speculative_output_equals_plain_greedy_with_rollbacks(swarm_model) -> None:
    """Widths 3 and 8: token-identical to plain greedy decoding through the swarm; drafts were both kept and
    rejected (so the chain's servers rolled back), and kept drafts saved round trips."""
    from transformers import AutoTokenizer

    sw, model = swarm_model
    chains = sw.get("/chains")["chains"]
    assert chains and all(len(c["spans"]) == 2 for c in chains), chains  # a rollback must reach two servers
    tok = AutoTokenizer.from_pretrained(str(SMOLLM2))
    new_tokens = 24
    drafted = accepted = 0
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        with model.inference_session(max_length=128) as s:
            plain = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                                   session=s)[0].tolist()
        for width in (3, 8):
            session = open_speculative_session(model, max_length=128)
            try:
                got, stats = speculative_generate(model, session, ids, new_tokens, width,
                                                  eos_token_id=tok.eos_token_id)
            finally:
                session.close()
            assert got == plain, (width, tok.decode(got[len(ids):]), tok.decode(plain[len(ids):]))
            assert stats.steps < 1 + new_tokens  # some steps wrote more than one token
            drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert 0 < accepted < drafted, (accepted, drafted)  # some drafts kept, some rolled back


def test_width_out_of_range_is_a_clear_error(swarm_model) -> None:
    """Width 0 or 33 (or not an integer) is refused before anything is sent, naming the field."""
    _, model = swarm_model
    session = open_speculative_session(model, max_length=64)
    try:
        for bad in (0, 33, 2.5, True):
            with pytest.raises(WidthError, match="width: must be an integer in 1..32"):
                speculative_generate(model, session, [1, 2, 3], 4, bad)
        assert session.position == 0
        with pytest.raises(WidthError, match="position: cannot roll back to 5"):
            session.rollback(5)
    finally:
        session.close()


def test_generate_decodes_at_the_width_the_lease_says(swarm_model) -> None:
    """A client loaded with speculative_k_max: model.generate() leases with k_max, gets its width from the lease
    reply (greedy(p*) on an idle swarm: the widest, 4, cut to the units; fixed-1 after POST /width: 1), verifies
    that many positions per step, and writes exactly what plain greedy decoding writes; the orchestrator counts the
    widths it chose."""
    from transformers import AutoTokenizer

    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client
    from petals_chain.protocol.blocking import request_json

    sw, plain_model = swarm_model
    tok = AutoTokenizer.from_pretrained(str(SMOLLM2))
    ids = torch.tensor([tok(PROMPTS[0])["input_ids"]])
    with plain_model.inference_session(max_length=128) as s:
        plain = plain_model.generate(ids, max_new_tokens=20, do_sample=False, session=s)[0].tolist()
    model = AutoDistributedModelForCausalLM.from_pretrained(str(SMOLLM2), orchestrator=sw.url, speculative_k_max=6)
    try:
        seen = {}
        units = sw.get("/width")["units"]
        assert units >= 2, units  # room for a width above 1
        for policy, expected in (("greedy-p", min(len(SPEEDUP), units)), ("fixed-1", 1)):
            request_json(sw.url + "/width", data={"policy": policy, "arrival_rate": 1e-3},
                         token=sw.api_token or sw.token)
            session = model.transformer.h.open_session(max_length=128)
            try:
                assert session.lease.width == expected, (policy, session.lease)
                got = model.generate(ids, max_new_tokens=20, do_sample=False, session=session)[0].tolist()
            finally:
                session.close()
            assert got == plain, (policy, tok.decode(got[ids.shape[1]:]), tok.decode(plain[ids.shape[1]:]))
            assert set(session.stats.widths) == {expected}
            seen[policy] = session.stats
            assert sw.get("/width")["chosen"] == {str(expected): 1}
        assert seen["greedy-p"].steps < seen["fixed-1"].steps  # wider steps kept some drafts
        own = model.generate(ids, max_new_tokens=20, do_sample=False)[0].tolist()  # a session of its own
        assert own == plain
        assert "petals_chain_width_chosen_total" in http_json_text(sw.url + "/metrics")
    finally:
        close_client(model)


def http_json_text(url: str) -> str:
    """GET a text route (Prometheus metrics)."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()
