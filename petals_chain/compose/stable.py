"""Installing a full recomposition without reloading servers for nothing.

A composer sees servers only through their figures: two servers with the same memory, times and batching curve are
interchangeable, and which of them gets which span depends on their order in the input. When a recomposition is
installed on a running swarm, every server whose span changed drops its sessions and loads new blocks (minutes on
a real GPU). :func:`keep_spans` renames, within each group of interchangeable servers, the candidate's spans so
that as many servers as possible keep the span they hold now. The result is the same composition (each index has
the same figures, the chains the same hops by index), only with fewer servers sent loading. A swarm of MIG slices
or of one GPU type with operator-pinned figures is made of few such groups; servers whose figures were measured one
by one rarely tie, and are left as the composer placed them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from petals_chain.model import Composition

__all__ = ["keep_spans", "spans_changed", "spans_of"]

Spans = Mapping[str, tuple[int, int]]  # server name -> PETALS span (start, end) it holds; (0, 0) or absent: none


def spans_of(comp: Composition) -> dict[str, tuple[int, int]]:
    """Every server's PETALS span in ``comp`` ((0, 0) for none)."""
    return {s.name: comp.placement.span(j) for j, s in enumerate(comp.servers)}


def spans_changed(held: Spans, candidate: Composition) -> int:
    """How many of ``candidate``'s block-holding servers would load blocks they do not hold (``held``)."""
    return sum(1 for name, span in spans_of(candidate).items() if span != (0, 0) and held.get(name, (0, 0)) != span)


def keep_spans(candidate: Composition, held: Spans) -> Composition:
    """``candidate`` with the names of interchangeable servers (equal figures) permuted so that each keeps the span
    it holds (``held``) where the candidate gives its group that span; ``candidate`` itself if nothing changes."""
    groups: dict[object, list[int]] = {}
    for j, s in enumerate(candidate.servers):
        groups.setdefault(replace(s, name="-"), []).append(j)
    names = [s.name for s in candidate.servers]
    for idx in groups.values():
        if len(idx) < 2:
            continue
        slots: dict[tuple[int, int], list[int]] = {}
        for j in idx:
            slots.setdefault(candidate.placement.span(j), []).append(j)
        members = [names[j] for j in idx]
        placed: dict[int, str] = {}
        rest = []
        for name in members:  # first every server whose current span the group still offers keeps it
            free = slots.get(held.get(name, (0, 0)))
            if free:
                placed[free.pop(0)] = name
            else:
                rest.append(name)
        open_idx = [j for j in idx if j not in placed]
        home = {names[j]: j for j in idx}
        for name in list(rest):  # then the others stay at their own index where it is still open
            if home[name] in open_idx:
                placed[home[name]] = name
                open_idx.remove(home[name])
                rest.remove(name)
        placed.update(zip(open_idx, rest))
        for j, name in placed.items():
            names[j] = name
    if names == [s.name for s in candidate.servers]:
        return candidate
    servers = tuple(replace(s, name=n) for s, n in zip(candidate.servers, names))
    return replace(candidate, servers=servers)
