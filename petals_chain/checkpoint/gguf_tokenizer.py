"""The tokenizer of a GGUF LLaMA checkpoint as a Hugging Face fast tokenizer: vocabulary, merges, special tokens.

:mod:`petals_chain.checkpoint.gguf_convert` converts the weights and calls :func:`save_tokenizer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from petals_chain.checkpoint.gguf_read import GGUFConvertError, field_value

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the special tokens named in the GGUF tokenizer metadata (None when the file gives none)."""

    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool


def _byte_level_pre_tokenizer(pre: str, add_prefix_space: bool) -> Any:
    """Build the `tokenizers` pre-tokenizer that reproduces llama.cpp's BPE pre-tokenizer type `pre`."""
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
    if pre == "smollm":  # digits one by one, then GPT-2's regex split and byte mapping
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("default", "gpt-2", "gpt2"):
        return byte_level
    raise GGUFConvertError(
        f"GGUF metadata 'tokenizer.ggml.pre' is {pre!r}; supported BPE pre-tokenizers: 'smollm', 'gpt-2', 'default'"
    )


def read_special_tokens(reader: Any, vocab_size: int) -> SpecialTokens:
    """Read bos/eos/unk/pad ids and add_bos from GGUF metadata, checking each id lies inside the vocabulary."""

    def token_id(key: str) -> int | None:
        """The optional token id `tokenizer.ggml.<key>`, checked against the vocabulary size."""
        value = field_value(reader, f"tokenizer.ggml.{key}", int, None, False)
        if value is not None and not 0 <= value < vocab_size:
            raise GGUFConvertError(
                f"GGUF metadata 'tokenizer.ggml.{key}'={value} is outside the vocabulary 0..{vocab_size - 1}"
            )
        return value

    return SpecialTokens(
        bos_id=token_id("bos_token_id"),
        eos_id=token_id("eos_token_id"),
        unk_id=token_id("unknown_token_id"),
        pad_id=token_id("padding_token_id"),
        add_bos=field_value(reader, "tokenizer.ggml.add_bos_token", bool, False, False),
    )


def _ids_of_type(types: Sequence[int], token_type: int) -> list[int]:
    """Token ids whose llama.cpp token type equals `token_type`."""
    return [i for i, k in enumerate(types) if k == token_type]


def build_tokenizer(reader: Any) -> tuple[Any, SpecialTokens, list[str]]:
    """Build a byte-level BPE `tokenizers.Tokenizer` from the GGUF vocab, merges, token types and pre-tokenizer type.

    Returns the tokenizer, the special-token ids, and the vocabulary (index = token id).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    model = field_value(reader, "tokenizer.ggml.model", str)
    if model != "gpt2":
        raise GGUFConvertError(f"GGUF metadata 'tokenizer.ggml.model' is {model!r}; only BPE ('gpt2') is supported")
    if "tokenizer.ggml.tokens" not in reader.fields:
        raise GGUFConvertError("GGUF metadata key 'tokenizer.ggml.tokens' is missing")
    tokens: list[str] = reader.fields["tokenizer.ggml.tokens"].contents()
    types_field = reader.fields.get("tokenizer.ggml.token_type")
    types: list[int] = types_field.contents() if types_field is not None else [1] * len(tokens)
    if len(types) != len(tokens):
        raise GGUFConvertError(
            f"GGUF metadata 'tokenizer.ggml.token_type' has {len(types)} entries for {len(tokens)} tokens"
        )
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFConvertError("GGUF metadata 'tokenizer.ggml.tokens' contains duplicate tokens")
    if "tokenizer.ggml.merges" not in reader.fields:
        raise GGUFConvertError("GGUF metadata key 'tokenizer.ggml.merges' is missing")
    merges: list[tuple[str, str]] = []
    for n, line in enumerate(reader.fields["tokenizer.ggml.merges"].contents()):
        left, sep, right = line.partition(" ")
        if not sep or left not in vocab or right not in vocab or left + right not in vocab:
            raise GGUFConvertError(f"GGUF metadata 'tokenizer.ggml.merges'[{n}] = {line!r} is not a valid merge 'a b'")
        merges.append((left, right))
    special = read_special_tokens(reader, len(tokens))
    unk = tokens[special.unk_id] if special.unk_id is not None else None

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=False, byte_fallback=False))
    add_prefix = field_value(reader, "tokenizer.ggml.add_space_prefix", bool, False, False)
    pre = field_value(reader, "tokenizer.ggml.pre", str, "default", False)
    tok.pre_tokenizer = _byte_level_pre_tokenizer(pre, add_prefix)
    tok.decoder = decoders.ByteLevel()
    if special.add_bos and special.bos_id is not None:
        bos = tokens[special.bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, special.bos_id)]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [AddedToken(tokens[i], normalized=False, special=True) for i in _ids_of_type(types, TOKEN_TYPE_CONTROL)]
    user = [AddedToken(tokens[i], normalized=False) for i in _ids_of_type(types, TOKEN_TYPE_USER_DEFINED)]
    tok.add_special_tokens(control)
    tok.add_tokens(user)
    for added in control + user:  # adding must keep the GGUF ids, not append new ones
        if tok.token_to_id(added.content) != vocab[added.content]:
            raise GGUFConvertError(f"added token {added.content!r} did not keep its GGUF id {vocab[added.content]}")
    return tok, special, tokens


def save_tokenizer(reader: Any, out_dir: Path, max_length: int) -> SpecialTokens:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json (transformers' fast-tokenizer files)."""
    from transformers import PreTrainedTokenizerFast

    tok, special, tokens = build_tokenizer(reader)
    types_field = reader.fields.get("tokenizer.ggml.token_type")
    types = types_field.contents() if types_field is not None else []
    named = {special.bos_id, special.eos_id, special.unk_id, special.pad_id}
    extra = [tokens[i] for i in _ids_of_type(types, TOKEN_TYPE_CONTROL) if i not in named]

    def name(i: int | None) -> str | None:
        """The token string of id `i` (None stays None)."""
        return tokens[i] if i is not None else None

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=name(special.bos_id),
        eos_token=name(special.eos_id),
        unk_token=name(special.unk_id),
        pad_token=name(special.pad_id),
        additional_special_tokens=extra,
        model_max_length=max_length,
        model_input_names=["input_ids", "attention_mask"],  # LLaMA takes no token_type_ids
        clean_up_tokenization_spaces=False,
        chat_template=field_value(reader, "tokenizer.chat_template", str, None, False),
    )
    fast.save_pretrained(str(out_dir))
    return special
