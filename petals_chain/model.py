"""The system model of the chain-serving paper (§2.1; docs/model.md) as frozen dataclasses.

Everything is in SI units: bytes for memory, seconds for time. Blocks are
1-indexed as in the paper; a server with ``num_blocks == 0`` holds nothing.
What a user reads is a 0-indexed half-open PETALS span ``start:end``:
:func:`petals_span` converts, :func:`span_text` and :func:`span_json` write it
(docs/model.md, "Conventions"). Construction validates its input and raises
:class:`SpecError` naming the offending field, so bad input never reaches the algorithms.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

GB = 1e9


class SpecError(ValueError):
    """A cluster, model or placement description is invalid; the message names the field."""


class InfeasibleError(ValueError):
    """The servers cannot host the model (or a requested capacity) at all."""


def _check_positive(owner: str, name: str, value: float, *, allow_zero: bool = False) -> None:
    """Raise SpecError unless ``value`` is a finite positive (or non-negative) number."""
    try:
        ok_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        finite = ok_number and math.isfinite(value)
    except TypeError:
        finite = False
    if not finite:
        raise SpecError(f"{owner}: field '{name}' must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise SpecError(f"{owner}: field '{name}' must be {bound}, got {value!r}")


def _check_span(start: int, end: int) -> tuple[int, int]:
    """(start, end) as ints; SpecError unless both are integers with 0 <= start <= end."""
    for name, v in (("start", start), ("end", end)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise SpecError(f"span: field '{name}' must be an integer, got {v!r}")
    if not 0 <= start <= end:
        raise SpecError(f"span: need 0 <= start <= end, got start={start!r}, end={end!r}")
    return int(start), int(end)


def petals_span(first_block: int, num_blocks: int) -> tuple[int, int]:
    """The PETALS span of blocks a .. a + m - 1 (1-indexed): (a - 1, a - 1 + m), end exclusive; (0, 0) if m = 0."""
    if num_blocks == 0:
        return (0, 0)
    if num_blocks < 0 or first_block < 1:
        raise SpecError(f"span: need first_block >= 1 and num_blocks >= 0, got {first_block!r}, {num_blocks!r}")
    return _check_span(first_block - 1, first_block - 1 + num_blocks)


def span_text(start: int, end: int) -> str:
    """A span as users read it in tables, logs and plots: 'start:end', as petals' ``--block_indices`` takes it."""
    start, end = _check_span(start, end)
    return f"{start}:{end}"


def span_json(start: int, end: int) -> dict[str, int]:
    """A span as every JSON document of ours writes it: ``{"start": start, "end": end}``."""
    start, end = _check_span(start, end)
    return {"start": start, "end": end}


@dataclass(frozen=True)
class ServerSpec:
    """One server j: memory M_j, communication time τc_j, per-block compute time τp_j (one session alone), and how
    sessions computed at the same time slow each other (docs/model.md,
    "Servers whose sessions slow each other: τp(b)").

    ``batch_slowdown`` is the server's measured step time with b sessions batched, relative to one alone:
    g(1) = 1, g(2), …, g(B) for b = 1..B, B the most sessions it batches; beyond B the steps of the extra sessions
    wait for another batch, g(b) = g(B)·b/B. Without a table, ``serial_fraction`` σ gives g(b) = 1 + σ(b − 1):
    σ = 0 is the paper's model (sessions never slow each other), σ = 1 a server that computes one session at a time
    (PETALS' own task pool). :meth:`step_factor` is the one place that reads either.
    """

    name: str
    memory_bytes: float
    tau_c_s: float
    tau_p_s: float
    serial_fraction: float = 0.0
    batch_slowdown: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpecError(f"server: field 'name' must be a non-empty string, got {self.name!r}")
        owner = f"server {self.name!r}"
        _check_positive(owner, "memory_bytes", self.memory_bytes)
        _check_positive(owner, "tau_c_s", self.tau_c_s, allow_zero=True)
        _check_positive(owner, "tau_p_s", self.tau_p_s)
        _check_positive(owner, "serial_fraction", self.serial_fraction, allow_zero=True)
        if self.serial_fraction > 1:
            raise SpecError(f"{owner}: field 'serial_fraction' must be <= 1, got {self.serial_fraction!r}")
        check_batch_slowdown(owner, self.batch_slowdown)

    def step_factor(self, sessions: int) -> float:
        """g(b): the time of one step with ``sessions`` sessions computed together, relative to one alone."""
        if sessions < 1:
            raise SpecError(f"server {self.name!r}: step_factor needs sessions >= 1, got {sessions!r}")
        table = self.batch_slowdown
        if not table:
            return 1.0 + self.serial_fraction * (sessions - 1)
        if sessions <= len(table):
            return table[sessions - 1]
        return table[-1] * sessions / len(table)

    @property
    def contended(self) -> bool:
        """Whether sessions computed together slow each other at all (False: the paper's model holds)."""
        return bool(self.batch_slowdown and any(g > 1.0 for g in self.batch_slowdown)) or (
            not self.batch_slowdown and self.serial_fraction > 0)

    @property
    def marginal_step_factor(self) -> float:
        """What each session adds to the step time once the server is saturated (σ, or g(B)/B from the table):
        the server finishes at most 1/(this · τp_j · m_j) jobs per second, however many sessions it holds."""
        if self.batch_slowdown:
            return self.batch_slowdown[-1] / len(self.batch_slowdown)
        return self.serial_fraction


def check_batch_slowdown(owner: str, table: Sequence[float]) -> None:
    """SpecError unless ``table`` is empty or g(1) = 1 followed by finite numbers that never fall (a step of more
    sessions never takes less time) and never exceed b (batching never costs more than running them in turn)."""
    if not isinstance(table, tuple):
        raise SpecError(f"{owner}: field 'batch_slowdown' must be a tuple of numbers, got {type(table).__name__}")
    if not table:
        return
    for b, g in enumerate(table, start=1):
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g):
            raise SpecError(f"{owner}: batch_slowdown[{b - 1}] must be a finite number, got {g!r}")
    if abs(table[0] - 1.0) > 1e-9:
        raise SpecError(f"{owner}: batch_slowdown must start with g(1) = 1, got {table[0]!r}")
    for b in range(2, len(table) + 1):
        g, prev = table[b - 1], table[b - 2]
        if g < prev - 1e-9 or g > b + 1e-9:
            raise SpecError(f"{owner}: batch_slowdown g({b}) = {g!r} must lie in [g({b - 1}) = {prev!r}, {b}]")


@dataclass(frozen=True)
class ModelSpec:
    """The served model: L blocks of s_m bytes each, s_c bytes of KV cache per block per job."""

    num_blocks: int
    block_bytes: float
    cache_bytes: float
    name: str = "model"

    def __post_init__(self) -> None:
        owner = f"model {self.name!r}"
        if isinstance(self.num_blocks, bool) or not isinstance(self.num_blocks, int) or self.num_blocks < 1:
            raise SpecError(f"{owner}: field 'num_blocks' (L) must be an integer >= 1, got {self.num_blocks!r}")
        _check_positive(owner, "block_bytes", self.block_bytes)
        _check_positive(owner, "cache_bytes", self.cache_bytes)


@dataclass(frozen=True)
class Placement:
    """Block placement: server j hosts blocks a_j .. a_j + m_j - 1 (1-indexed); m_j = 0 means none."""

    first_block: tuple[int, ...]
    num_blocks: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.first_block) != len(self.num_blocks):
            raise SpecError("placement: 'first_block' and 'num_blocks' differ in length")
        for j, (a, m) in enumerate(zip(self.first_block, self.num_blocks)):
            if m < 0 or (m > 0 and a < 1):
                raise SpecError(f"placement: server index {j} has first_block={a}, num_blocks={m}")

    @property
    def num_servers(self) -> int:
        return len(self.num_blocks)

    def hosts(self, j: int) -> bool:
        return self.num_blocks[j] > 0

    def end(self, j: int) -> int:
        """One past the last block server j holds (a_j + m_j)."""
        return self.first_block[j] + self.num_blocks[j]

    def span(self, j: int) -> tuple[int, int]:
        """Server j's blocks as a PETALS span (start, end), 0-indexed, end exclusive; (0, 0) when it holds none."""
        return petals_span(self.first_block[j], self.num_blocks[j])

    def check_for(self, model: ModelSpec) -> None:
        """Raise SpecError if some server claims blocks outside 1..L."""
        for j, (a, m) in enumerate(zip(self.first_block, self.num_blocks)):
            if m > 0 and a + m - 1 > model.num_blocks:
                raise SpecError(
                    f"placement: server index {j} holds blocks {span_text(*self.span(j))} but the model has "
                    f"{model.num_blocks} blocks (0:{model.num_blocks})"
                )


@dataclass(frozen=True)
class Chain:
    """A server chain: servers in block order, blocks processed at each (m_ij), capacity c_k, time per job T_k."""

    servers: tuple[int, ...]
    blocks: tuple[int, ...]
    capacity: int
    service_time_s: float
    load_rates: tuple[float, ...] = ()  # jobs/s with n = 1..c_k jobs in it where its servers slow with their batch

    @property
    def rate_per_s(self) -> float:
        """μ_k = 1 / T_k (T_k with all its c_k slots busy where ``load_rates`` is given)."""
        return 1.0 / self.service_time_s

    def rate_with(self, jobs: int) -> float:
        """Jobs per second the chain finishes with ``jobs`` (1..c_k) of them in it: ``load_rates`` where its servers
        slow with their batch (compose/serial.py), else jobs·μ_k (the paper's model)."""
        if self.load_rates:
            return self.load_rates[jobs - 1]
        return jobs / self.service_time_s

    def spans(self) -> list[tuple[int, int, int]]:
        """(server index, first block 1-indexed, number of blocks) for each hop."""
        out: list[tuple[int, int, int]] = []
        start = 1
        for j, m in zip(self.servers, self.blocks):
            out.append((j, start, m))
            start += m
        return out

    def petals_spans(self) -> list[tuple[int, int, int]]:
        """(server index, start, end) for each hop that processes blocks: the PETALS spans a session runs along."""
        return [(j, *petals_span(a, m)) for j, a, m in self.spans() if m > 0]


@dataclass(frozen=True)
class Composition:
    """Servers + model + placement + chains with capacities: what compose produces."""

    servers: tuple[ServerSpec, ...]
    model: ModelSpec
    placement: Placement
    chains: tuple[Chain, ...]
    c: int = 0
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def total_rate_per_s(self) -> float:
        """ν = Σ_k c_k μ_k."""
        return sum(ch.capacity * ch.rate_per_s for ch in self.chains)

    @property
    def total_capacity(self) -> int:
        return sum(ch.capacity for ch in self.chains)

    def sorted_chains(self) -> tuple[Chain, ...]:
        """Chains fastest first (μ_1 ≥ … ≥ μ_K)."""
        return tuple(sorted(self.chains, key=lambda ch: ch.service_time_s))


def validate_servers(servers: Sequence[ServerSpec]) -> tuple[ServerSpec, ...]:
    """Return servers as a tuple; raise SpecError on an empty list or duplicate names."""
    servers = tuple(servers)
    if not servers:
        raise SpecError("servers: at least one server is required")
    seen: set[str] = set()
    for s in servers:
        if not isinstance(s, ServerSpec):
            raise SpecError(f"servers: expected ServerSpec, got {type(s).__name__}")
        if s.name in seen:
            raise SpecError(f"servers: duplicate server name {s.name!r}")
        seen.add(s.name)
    return servers
