"""Theorem 1's properties of a Mell allocation, checked on a live state (docs/mell.md, "Theorem 1 as we check it").

Exceptions: the most recently activated GPU of each label (at most four GPUs), the paper's constant c.
"""

from __future__ import annotations

from petals_chain.mell.classes import SizeClass
from petals_chain.mell.state import PackingState

L, M, S, T = SizeClass.L, SizeClass.M, SizeClass.S, SizeClass.T


def capacity_violations(st: PackingState) -> list[str]:
    """GPUs over C, empty GPUs kept, and bookkeeping that disagrees with the sizes."""
    out = []
    seen: set[int] = set()
    for g, gpu in st.gpus.items():
        used = 0
        for i in gpu.items:
            it = st.items[i]
            if it.gpu != g:
                out.append(f"item {i} on GPU {g} says GPU {it.gpu}")
            used += st.item_size(it)
            seen.update(it.members)
        if used != gpu.used:
            out.append(f"GPU {g}: used {gpu.used} but items sum to {used}")
        if used > st.C:
            out.append(f"GPU {g}: {used} tokens > C={st.C}")
        if not gpu.items:
            out.append(f"GPU {g} is empty but active")
    if seen != set(st.size):
        out.append(f"{len(set(st.size) ^ seen)} requests placed on no GPU or unknown")
    return out


def theorem1_violations(st: PackingState) -> list[str]:
    """Properties (1)–(5) of Theorem 1 on every GPU but each label's most recent one; messages name the GPU."""
    out = []
    latest = {lab: max(st.by_label[lab], default=None) for lab in (L, M, S, T)}
    cls = {g: [st.item_class(st.items[i]) for i in gpu.items] for g, gpu in st.gpus.items()}
    t_items = [st.item_size(st.items[i]) for g in st.by_label[T] if g != latest[T] for i in st.gpus[g].items]
    min_t = min(t_items, default=None)
    ms_on_ms = [(g, st.item_size(st.items[i])) for lab in (M, S) for g in st.by_label[lab]
                for i in st.gpus[g].items if st.item_class(st.items[i]) == lab]
    for g, gpu in st.gpus.items():
        lab = gpu.label
        if g == latest[lab]:
            continue
        c = cls[g]
        if lab == M and not (c.count(M) == 2 and c.count(T) <= 1 and len(c) == c.count(M) + c.count(T)):
            out.append(f"(1) M-GPU {g} holds {sorted(c)} (want 2 M and at most 1 T)")
        if lab == S and not (c.count(S) == 3 and len(c) == 3):
            out.append(f"(2) S-GPU {g} holds {sorted(c)} (want 3 S)")
        if lab == T and 4 * gpu.used < 3 * st.C:
            out.append(f"(3) T-GPU {g} at {gpu.used / st.C:.1%} < 75 %")
        if lab == L and c.count(M) + c.count(S) == 0:
            big = max(st.item_size(st.items[i]) for i in gpu.items)
            fit = [(g2, s) for g2, s in ms_on_ms if big + s < st.C]
            if fit:
                out.append(f"(4) L-GPU {g} has no M/S but {len(fit)} M/S items on M/S-GPUs fit it")
        if lab in (L, M) and min_t is not None and 4 * gpu.used < 3 * st.C:
            if lab == L or c.count(T) == 0:
                if min_t <= st.C - gpu.used:
                    out.append(f"(5) {lab.name}-GPU {g} at {gpu.used / st.C:.1%} < 75 % while a T item "
                               f"({min_t} tokens) on a T-GPU fits it")
    return out
