"""Convert a llama.cpp GGUF LLaMA checkpoint into a local Hugging Face checkpoint directory.

PETALS and transformers load HF directories (config.json + model.safetensors + tokenizer files); the small
real model we test with (SmolLM2-135M-Instruct) ships only as a quantized GGUF file, so we dequantize it to float32.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.checkpoint.gguf_read import GGUFConvertError, LlamaHyperparams, open_gguf, read_hyperparams
from petals_chain.checkpoint.gguf_tokenizer import save_tokenizer

MANIFEST_NAME = "gguf_source.json"
WEIGHTS_NAME = "model.safetensors"
OUTPUT_FILES = (
    "config.json",
    "generation_config.json",
    WEIGHTS_NAME,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)

# GGUF per-block tensor names -> Hugging Face LLaMA names (format with the block index).
BLOCK_TENSOR_NAMES = {
    "attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
GLOBAL_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# llama.cpp token types (gguf.TokenType): 3 = CONTROL (special), 4 = USER_DEFINED (added, not special).


@dataclass(frozen=True)
class ConversionReport:
    """What one conversion did: where it wrote, how long it took, how much it wrote."""

    out_dir: Path
    seconds: float
    num_tensors: int
    weights_bytes: int
    skipped: bool = False




# ---------------------------------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------------------------------


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary row order of a Q or K matrix (pairs interleaved -> HF's two half-blocks per head)."""
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise GGUFConvertError(f"cannot un-permute a matrix of {rows} rows into {n_heads} heads of even width")
    per_half = rows // n_heads // 2
    return w.reshape(n_heads, per_half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_shapes(hp: LlamaHyperparams) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> (out, in) shape of every tensor a LLaMA checkpoint with these hyper-parameters holds."""
    h, f, kv = hp.hidden_size, hp.intermediate_size, hp.num_key_value_heads * hp.head_dim
    per_block = {
        "attn_norm.weight": (h,),
        "attn_q.weight": (h, h),
        "attn_k.weight": (kv, h),
        "attn_v.weight": (kv, h),
        "attn_output.weight": (h, h),
        "ffn_norm.weight": (h,),
        "ffn_gate.weight": (f, h),
        "ffn_up.weight": (f, h),
        "ffn_down.weight": (h, f),
    }
    shapes = {
        "model.embed_tokens.weight": (hp.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not hp.tie_word_embeddings:
        shapes["lm_head.weight"] = (hp.vocab_size, h)
    for i in range(hp.num_hidden_layers):
        for suffix, shape in per_block.items():
            shapes[BLOCK_TENSOR_NAMES[suffix].format(i=i)] = shape
    return shapes


def hf_tensor_name(gguf_name: str) -> str:
    """Map a GGUF tensor name (e.g. 'blk.3.attn_q.weight') to its Hugging Face LLaMA name."""
    if gguf_name in GLOBAL_TENSOR_NAMES:
        return GLOBAL_TENSOR_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in BLOCK_TENSOR_NAMES:
        return BLOCK_TENSOR_NAMES[parts[2]].format(i=int(parts[1]))
    raise GGUFConvertError(f"GGUF tensor {gguf_name!r} has no Hugging Face LLaMA counterpart")


def convert_weights(
    reader: Any, hp: LlamaHyperparams, progress: bool = False
) -> dict[str, np.ndarray]:
    """Dequantize every GGUF tensor to float32, rename it for HF, un-permute Q/K, and check all shapes."""
    import gguf
    from tqdm import tqdm

    want = expected_shapes(hp)
    out: dict[str, np.ndarray] = {}
    for t in tqdm(reader.tensors, desc="dequantize", unit="tensor", disable=not progress):
        name = hf_tensor_name(t.name)
        if name not in want:
            raise GGUFConvertError(f"GGUF tensor {t.name!r} ({name}) is outside the model the metadata describes")
        if name in out:
            raise GGUFConvertError(f"GGUF tensor {t.name!r} appears twice")
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as exc:
            raise GGUFConvertError(f"GGUF tensor {t.name!r}: {exc}") from exc
        if w.ndim == 2 and w.shape[0] == 1 and len(want[name]) == 1:
            w = w.reshape(-1)
        if tuple(w.shape) != want[name]:
            raise GGUFConvertError(
                f"GGUF tensor {t.name!r} has shape {tuple(w.shape)} after dequantization, expected {want[name]} "
                "from the metadata"
            )
        if t.name.endswith("attn_q.weight"):
            w = unpermute_qk(w, hp.num_attention_heads)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute_qk(w, hp.num_key_value_heads)
        out[name] = np.ascontiguousarray(w, dtype=np.float32)
    missing = sorted(set(want) - set(out))
    if missing:
        raise GGUFConvertError(f"GGUF file lacks {len(missing)} tensors the metadata implies, e.g. {missing[:3]}")
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Whole conversion
# ---------------------------------------------------------------------------------------------------------------------


def sha256_file(path: Path, chunk_bytes: int = 1 << 22) -> str:
    """Hex SHA-256 of a file, read in chunks (identifies the GGUF source and the converter version)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def _manifest(gguf_path: Path) -> dict[str, Any]:
    """The provenance record that marks a directory as this converter's output for this exact GGUF file."""
    return {
        "gguf_file": gguf_path.name,
        "gguf_bytes": gguf_path.stat().st_size,
        "gguf_sha256": sha256_file(gguf_path),
        "converter_sha256": sha256_file(Path(__file__)),
        "files": list(OUTPUT_FILES),
    }


def is_converted(gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> bool:
    """True when out_dir holds a complete conversion of this GGUF file made by this version of the converter."""
    out = Path(out_dir)
    src = Path(gguf_path)
    try:
        recorded = json.loads((out / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return False
    if not src.is_file() or recorded.get("gguf_bytes") != src.stat().st_size:
        return False
    if any(not (out / f).is_file() for f in OUTPUT_FILES):
        return False
    return recorded == _manifest(src)


def _make_readable(directory: Path) -> None:
    """Give the temp directory and its files the usual umask modes (mkdtemp and safetensors make them 0700/0600)."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for f in directory.iterdir():
        f.chmod(0o666 & ~umask)


def _prepare_out_dir(out: Path) -> None:
    """Refuse to overwrite a directory that is neither empty nor a previous conversion (guards user data)."""
    if out.exists() and not out.is_dir():
        raise GGUFConvertError(f"output path exists and is not a directory: {out}")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST_NAME).is_file():
        raise GGUFConvertError(
            f"output directory {out} is not empty and holds no previous conversion ({MANIFEST_NAME})"
        )


def convert(
    gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str], progress: bool = False
) -> ConversionReport:
    """Convert a GGUF LLaMA file into a Hugging Face checkpoint directory, written atomically (temp dir + rename)."""
    from safetensors.numpy import save_file
    from transformers import GenerationConfig, LlamaConfig

    start_s = time.perf_counter()
    src = Path(gguf_path)
    out = Path(out_dir)
    _prepare_out_dir(out)
    reader = open_gguf(src)
    hp = read_hyperparams(reader)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        special = save_tokenizer(reader, tmp, hp.max_position_embeddings)
        if hp.vocab_size != len(reader.fields["tokenizer.ggml.tokens"].data):
            raise GGUFConvertError(
                f"llama.vocab_size={hp.vocab_size} differs from the {len(reader.fields['tokenizer.ggml.tokens'].data)} "
                "tokens in tokenizer.ggml.tokens"
            )
        config = LlamaConfig(
            vocab_size=hp.vocab_size,
            hidden_size=hp.hidden_size,
            intermediate_size=hp.intermediate_size,
            num_hidden_layers=hp.num_hidden_layers,
            num_attention_heads=hp.num_attention_heads,
            num_key_value_heads=hp.num_key_value_heads,
            hidden_act="silu",
            max_position_embeddings=hp.max_position_embeddings,
            rms_norm_eps=hp.rms_norm_eps,
            rope_theta=hp.rope_theta,
            tie_word_embeddings=hp.tie_word_embeddings,
            bos_token_id=special.bos_id,
            eos_token_id=special.eos_id,
            pad_token_id=special.pad_id,
            torch_dtype="float32",
            architectures=["LlamaForCausalLM"],
        )
        config.save_pretrained(str(tmp))
        GenerationConfig(
            bos_token_id=special.bos_id, eos_token_id=special.eos_id, pad_token_id=special.pad_id
        ).save_pretrained(str(tmp))
        weights = convert_weights(reader, hp, progress=progress)
        weights_bytes = sum(w.nbytes for w in weights.values())
        save_file(weights, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        num_tensors = len(weights)
        del weights
        (tmp / MANIFEST_NAME).write_text(json.dumps(_manifest(src), indent=2) + "\n")
        _make_readable(tmp)
        _prepare_out_dir(out)  # re-check: someone may have written there meanwhile
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ConversionReport(out, time.perf_counter() - start_s, num_tensors, weights_bytes)


def convert_if_needed(
    gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str], progress: bool = False
) -> ConversionReport:
    """Convert unless out_dir already holds this converter's complete output for this GGUF file."""
    if is_converted(gguf_path, out_dir):
        return ConversionReport(Path(out_dir), 0.0, 0, 0, skipped=True)
    return convert(gguf_path, out_dir, progress=progress)


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: convert GGUF_PATH into OUT_DIR; print the output path (stdout), a summary (stderr); exit 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m petals_chain.checkpoint.gguf_convert", description=__doc__)
    parser.add_argument("gguf_path", help="llama.cpp GGUF file of a LLaMA-architecture model")
    parser.add_argument("out_dir", help="directory to write the Hugging Face checkpoint into")
    parser.add_argument("--if-needed", action="store_true", help="skip when OUT_DIR already holds this conversion")
    parser.add_argument("--no-progress", action="store_true", help="do not draw a progress bar")
    args = parser.parse_args(argv)
    runner = convert_if_needed if args.if_needed else convert
    try:
        report = runner(args.gguf_path, args.out_dir, progress=not args.no_progress)
    except GGUFConvertError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if report.skipped:
        print(f"already converted: {report.out_dir}", file=sys.stderr)
    else:
        print(
            f"converted {report.num_tensors} tensors ({report.weights_bytes / 1e6:.0f} MB float32) in "
            f"{report.seconds:.1f} s, peak RSS {peak_rss_bytes() / 1e9:.2f} GB -> {report.out_dir}",
            file=sys.stderr,
        )
    print(report.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
