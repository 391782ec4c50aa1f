"""Adaptive migration division (docs/mell.md, "Adaptive migration"): each move goes as a KV transfer or as
token replay (re-prefill at the destination), so that no link carries more bytes and no destination
prefills more tokens per epoch than its budget. Every caller runs the same deterministic greedy over the
whole cluster's moves, so they all reach the same division without talking ("global consensus").

Three rules pick a move's mode among those that fit: ``first`` (KV transfer first, the paper's), ``best`` (least
normalised slack left) and ``fastest`` (the mode whose estimated time, from the profiled :class:`Speeds`, is
shorter).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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


LINK_BYTES_PER_S = 1.25e9  # a link's default bandwidth: 10 Gbit/s, the simulator's link across machines
PREFILL_TOKENS_PER_S = 8000.0  # a destination's default re-prefill rate (the simulator's, LLaMA-2-7B on a GPU)
RULES = ("first", "best", "fastest")


@dataclass(frozen=True)
class Speeds:
    """Profiled rates that turn a move into seconds, from the same profiling as the budgets: a KV transfer takes
    ``kv_setup_s + bytes / bandwidth`` (its slowest link), token replay of ``n`` tokens ``n / rate · (1 + n /
    prefill_doubling_tokens)`` at the destination (a token's prefill cost grows with the context before it:
    attention; ``inf`` keeps it linear)."""

    link_bytes_per_s: Mapping[str, float] = field(default_factory=dict)
    prefill_tokens_per_s: Mapping[int, float] = field(default_factory=dict)
    default_link_bytes_per_s: float = LINK_BYTES_PER_S
    default_prefill_tokens_per_s: float = PREFILL_TOKENS_PER_S
    kv_setup_s: float = 0.0  # fixed cost of a KV transfer: opening the new sessions, the export round trips
    prefill_doubling_tokens: float = math.inf  # replaying this many tokens takes twice what a linear rate says

    def __post_init__(self) -> None:
        rates = [*self.link_bytes_per_s.values(), *self.prefill_tokens_per_s.values(),
                 self.default_link_bytes_per_s, self.default_prefill_tokens_per_s, self.prefill_doubling_tokens]
        if not all(r > 0 for r in rates) or not self.kv_setup_s >= 0:
            raise ValueError(f"Speeds: rates must be > 0 and kv_setup_s >= 0, got {self}")

    def kv_s(self, links: Sequence[str], nbytes: float) -> float:
        """Estimated seconds of a KV transfer of ``nbytes`` over ``links`` (the slowest one bounds it)."""
        bw = min((self.link_bytes_per_s.get(lnk, self.default_link_bytes_per_s) for lnk in links),
                 default=self.default_link_bytes_per_s)
        return self.kv_setup_s + nbytes / bw

    def token_s(self, dst: int, tokens: int) -> float:
        """Estimated seconds of re-prefilling ``tokens`` at destination ``dst``."""
        rate = self.prefill_tokens_per_s.get(dst, self.default_prefill_tokens_per_s)
        return tokens / rate * (1.0 + tokens / self.prefill_doubling_tokens)


def profile_speeds(kv: Sequence[tuple[float, float]], replay: Sequence[tuple[int, float]]) -> Speeds:
    """One link's :class:`Speeds` from two profiling runs per mode, the shortest and the longest session:
    ``kv`` (bytes, seconds) gives the bandwidth and the setup time (the line through them), ``replay`` (tokens,
    seconds) the rate and the doubling length (seconds per token, linear in the tokens)."""
    if not kv or not replay:
        raise ValueError("profile_speeds needs at least one KV and one replay measurement")
    (b0, t0), (b1, t1) = min(kv), max(kv)
    if b1 > b0 and t1 > t0:
        bw = (b1 - b0) / (t1 - t0)
        setup = max(0.0, t0 - b0 / bw)
    else:
        bw, setup = b1 / t1, 0.0
    (n0, r0), (n1, r1) = min(replay), max(replay)
    p0, p1 = r0 / n0, r1 / n1  # seconds per token at each length
    slope = (p1 - p0) / (n1 - n0) if n1 > n0 else 0.0
    base = p0 - slope * n0
    if slope <= 0 or base <= 0:  # no growth measured (or more than linear): one rate, from the longest run
        return Speeds({}, {}, bw, n1 / r1, setup)
    return Speeds({}, {}, bw, 1.0 / base, setup, base / slope)


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
                  path: Callable[[int, int], tuple[str, ...]], rule: str = "first",
                  speeds: Speeds | None = None) -> Division:
    """Greedy two-bin packing of the moves, largest first (ties by request id, so every caller agrees).

    ``rule='first'`` tries KV transfer first, then token replay; ``rule='best'`` takes the feasible mode
    that leaves the least normalised slack; ``rule='fastest'`` the feasible mode with the shorter estimated time
    under ``speeds`` (KV on a tie). A move that fits neither budget is deferred to the next epoch.
    """
    if kv_bytes_per_token <= 0:
        raise ValueError(f"kv_bytes_per_token must be > 0, got {kv_bytes_per_token}")
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if rule == "fastest" and speeds is None:
        raise ValueError("rule 'fastest' needs speeds (the profiled bandwidth and prefill rate)")
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
        elif rule == "fastest":
            if kv_ok and tok_ok:
                faster = speeds.kv_s(links, nbytes) <= speeds.token_s(mv.dst, mv.size_tokens)
                mode = Mode.KV if faster else Mode.TOKEN
            else:
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
