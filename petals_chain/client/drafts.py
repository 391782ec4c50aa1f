"""Speculative drafts that need no second model (prompt lookup), and the width's range check; torch-free so that
the orchestrator and the tests use them cheaply (docs/moldable.md, "Speculative width on the swarm")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from petals_chain.model import SpecError

MAX_WIDTH = 32  # positions per step; the experiments use 1..8
Drafter = Callable[[Sequence[int], int], list[int]]


class WidthError(SpecError):
    """A speculative width (positions verified per step) outside 1..MAX_WIDTH, or a bad draft setting."""


def check_width(width: Any, field_name: str = "width", max_width: int = MAX_WIDTH) -> int:
    """``width`` as an int in 1..max_width; WidthError naming the field otherwise (1 = plain greedy decoding)."""
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= max_width:
        raise WidthError(f"{field_name}: must be an integer in 1..{max_width} (positions verified per step; "
                         f"1 = plain greedy decoding), got {width!r}")
    return width


def prompt_lookup_draft(tokens: Sequence[int], count: int, max_ngram: int = 3) -> list[int]:
    """Up to ``count`` tokens that followed the latest earlier occurrence of the text's last n tokens, trying
    n = max_ngram down to 1 (prompt lookup decoding); [] when nothing matches."""
    if count <= 0:
        return []
    seq = list(tokens)
    n_tokens = len(seq)
    for n in range(min(max_ngram, n_tokens - 1), 0, -1):
        tail = seq[n_tokens - n:]
        for start in range(n_tokens - n - 1, -1, -1):  # latest match first, never the tail itself
            if seq[start:start + n] == tail:
                follow = seq[start + n:start + n + count]
                if follow:
                    return follow
    return []
