"""Adaptive migration division (docs/mell.md, "Adaptive migration"): each move goes as a KV transfer or as
token replay (re-prefill at the destination), so that no link carries more bytes and no destination
prefills more tokens per epoch than its budget. Every caller runs the same deterministic greedy over the
whole cluster's moves, so they all reach the same division without talking ("global consensus").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from petals_chain.mell.state import Move


class Mode(str, Enum):
    """How one move is carried out this epoch."""

    KV = "kv"
    TOKEN = "token"
    DEFER = "defer"


@dataclass(frozen=True)
class Budgets:
    """Per-epoch boundaries from offline profiling: bytes per link, migration-prefill tokens per destination."""

    link_bytes: Mapping[str, float]
    prefill_tokens: Mapping[int, int]
    default_link_bytes: float = 0.0
    default_prefill_tokens: int = 0

    def link(self, name: str) -> float:
        return self.link_bytes.get(name, self.default_link_bytes)

    def prefill(self, gpu: int) -> int:
        return self.prefill_tokens.get(gpu, self.default_prefill_tokens)


@dataclass(frozen=True)
class Division:
    """The mode of every move (in the input order) and what each link and destination was charged."""

    modes: tuple[Mode, ...]
    link_bytes: dict[str, float]
    prefill_tokens: dict[int, int]


def machine_path(gpus_per_machine: int) -> Callable[[int, int], tuple[str, ...]]:
    """Links of a move: the PCIe link inside one machine, or both machines' NICs across machines."""
    if gpus_per_machine < 1:
        raise ValueError(f"gpus_per_machine must be >= 1, got {gpus_per_machine}")

    def path(src: int, dst: int) -> tuple[str, ...]:
        a, b = src // gpus_per_machine, dst // gpus_per_machine
        return (f"pcie{a}",) if a == b else (f"nic{a}", f"nic{b}")

    return path


def hybrid_divide(moves: Sequence[Move], kv_bytes_per_token: int, budgets: Budgets,
                  path: Callable[[int, int], tuple[str, ...]], rule: str = "first") -> Division:
    """Greedy two-bin packing of the moves, largest first (ties by request id, so every caller agrees).

    ``rule='first'`` tries KV transfer first, then token replay; ``rule='best'`` takes the feasible mode
    that leaves the least normalised slack. A move that fits neither budget is deferred to the next epoch.
    """
    if kv_bytes_per_token <= 0:
        raise ValueError(f"kv_bytes_per_token must be > 0, got {kv_bytes_per_token}")
    if rule not in ("first", "best"):
        raise ValueError(f"rule must be 'first' or 'best', got {rule!r}")
    used_b: dict[str, float] = {}
    used_p: dict[int, int] = {}
    modes: list[Mode | None] = [None] * len(moves)
    order = sorted(range(len(moves)), key=lambda k: (-moves[k].size_tokens, moves[k].request, k))
    for k in order:
        mv = moves[k]
        links = path(mv.src, mv.dst)
        nbytes = mv.size_tokens * kv_bytes_per_token
        kv_ok = all(used_b.get(lnk, 0.0) + nbytes <= budgets.link(lnk) for lnk in links)
        cap_p = budgets.prefill(mv.dst)
        tok_ok = used_p.get(mv.dst, 0) + mv.size_tokens <= cap_p
        if rule == "first":
            mode = Mode.KV if kv_ok else Mode.TOKEN if tok_ok else Mode.DEFER
        else:
            slack = {}
            if kv_ok:
                slack[Mode.KV] = min((budgets.link(lnk) - used_b.get(lnk, 0.0) - nbytes) / budgets.link(lnk)
                                     for lnk in links)
            if tok_ok:
                slack[Mode.TOKEN] = (cap_p - used_p.get(mv.dst, 0) - mv.size_tokens) / cap_p
            mode = min(slack, key=lambda m: (slack[m], m.value)) if slack else Mode.DEFER
        if mode == Mode.KV:
            for lnk in links:
                used_b[lnk] = used_b.get(lnk, 0.0) + nbytes
        elif mode == Mode.TOKEN:
            used_p[mv.dst] = used_p.get(mv.dst, 0) + mv.size_tokens
        modes[k] = mode
    return Division(tuple(m for m in modes if m is not None), used_b, used_p)
