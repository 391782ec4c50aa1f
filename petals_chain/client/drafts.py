"""Speculative drafts that need no second model (prompt lookup); torch-free so that the tests use them cheaply.

The width's range check is :mod:`petals_chain.moldable.width_range`;
docs/moldable.md, "Speculative width on the swarm".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Drafter = Callable[[Sequence[int], int], list[int]]


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
