"""How close a Table 1 testbed is to the paper's regime: the ratios that shape the result, next to the paper's.

Pure computation over server specs (memory, τc, τp per block) and a model: per server the cache-to-weights
ratio at the paper composition's c, the spans m_j(c) as a fraction of L, the paper composition's chains
(hops and server pairs), τc / (τp·L), and each method's load (replay rate / the method's capacity). The
paper's side is computed by the same code from its testbed's cluster (LLaMA-2-7B on 3 × 3g.40gb +
6 × 2g.20gb, docs/model.md "Paper settings"); the emulated side from a testbed file and its fitted
profile (docs/table1.md, "The paper's regime"). CLI: ``python -m petals_chain.experiments.table1_regime``
(or ``experiments/table1.sh --regime``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from petals_chain.compose.method_table import METHODS, Routing
from petals_chain.compose.petals_default import DEFAULT_CACHE_JOBS
from petals_chain.compose.tuning import compose_for_c
from petals_chain.model import Composition, InfeasibleError, ModelSpec, ServerSpec, SpecError

PAPER_C = 35  # the reserved concurrency of the paper's Table 1 composition
PAPER_DESIGN_RATE_FACTOR = 8.0  # the authors composed for about 8 × the trace's rate (2.57 req/s)
PAPER_SPANS = (24, 12)  # published spans of 3g.40gb / 2g.20gb servers, of L = 32
PAPER_CACHE_TO_WEIGHTS = (2.7, 2.9)  # the published range per server


@dataclass(frozen=True)
class MethodLoad:
    """A method's capacity (jobs/s) for the replay and the load replay rate / capacity; ``how`` says which bound."""

    method: str
    capacity_per_s: float
    load: float
    how: str  # "chains" (Σ c_k μ_k) or "block cut" (upper bound on capacity: the load is a lower bound)
    c: int = 0
    note: str = ""


@dataclass(frozen=True)
class ServerRatios:
    """One server's figures at the paper composition's c."""

    name: str
    span_blocks: int  # m_j(c)
    span_fraction: float  # m_j(c) / L
    cache_to_weights: float  # c·s_c·m_j / (s_m·m_j)
    memory_used: float  # (s_m + c·s_c)·m_j / M_j
    comm_to_compute: float  # τc_j / (τp_j · L)


@dataclass(frozen=True)
class Regime:
    """Everything the report prints for one testbed."""

    label: str
    num_blocks: int
    c: int
    replay_rate_per_s: float
    design_rate_per_s: float
    servers: tuple[ServerRatios, ...]
    chains: tuple[tuple[str, ...], ...]  # the paper composition's chains, server names in block order
    chain_capacities: tuple[int, ...]
    loads: tuple[MethodLoad, ...]
    notes: tuple[str, ...] = field(default=())

    def hops(self) -> list[int]:
        """Number of servers of each chain."""
        return [len(ch) for ch in self.chains]


def span_blocks(memory_bytes: float, model: ModelSpec, c: int) -> int:
    """Equation 8: m_j(c) = min(⌊M_j / (s_m + s_c·c)⌋, L)."""
    if c < 1:
        raise SpecError(f"c must be an integer >= 1, got {c!r}")
    return int(min(math.floor(memory_bytes / (model.block_bytes + model.cache_bytes * c)), model.num_blocks))


def block_cut_capacity(servers: Sequence[ServerSpec], model: ModelSpec, comp: Composition,
                       slots: Sequence[int]) -> float:
    """Upper bound on a chain-less placement's throughput: min over blocks of Σ_{j holds it} slots_j / t_j.

    A server j holding m_j blocks with ``slots_j`` sessions finishes at most slots_j / (τc_j + τp_j·m_j) jobs/s
    (the paper's service model, no slowdown under concurrency); every job needs every block."""
    p = comp.placement
    per_block = [0.0] * model.num_blocks
    for j, s in enumerate(servers):
        m = int(p.num_blocks[j])
        if m <= 0 or slots[j] <= 0:
            continue
        rate = slots[j] / (s.tau_c_s + s.tau_p_s * m)
        for b in range(int(p.first_block[j]) - 1, int(p.first_block[j]) - 1 + m):  # first_block is 1-indexed
            per_block[b] += rate
    return min(per_block)


def method_load(method: str, servers: Sequence[ServerSpec], model: ModelSpec, replay_rate: float,
                compose_rate: float, *, c: int | None = None) -> MethodLoad:
    """The method's composition at ``compose_rate`` (``c`` fixed where given) and its load at ``replay_rate``."""
    entry = METHODS.get(method)
    if entry is None:
        raise SpecError(f"method: unknown method {method!r}; choose from {', '.join(METHODS)}")
    try:
        if c is not None and entry.tunes_c and method == "paper":
            comp = compose_for_c(servers, model, c, compose_rate)
        else:
            comp = entry.compose(servers, model, compose_rate)
    except InfeasibleError as exc:
        return MethodLoad(method, 0.0, math.inf, "infeasible", note=str(exc))
    if comp.chains:
        cap = comp.total_rate_per_s
        return MethodLoad(method, cap, replay_rate / cap, "chains", comp.c)
    if entry.routing is Routing.PETALS:
        slots = [DEFAULT_CACHE_JOBS] * len(servers)
    else:  # BPRR: every server reserves cache for R jobs (CG-BP)
        slots = [max(comp.c, 1)] * len(servers)
    cap = block_cut_capacity(servers, model, comp, slots)
    return MethodLoad(method, cap, replay_rate / cap if cap > 0 else math.inf, "block cut", comp.c,
                      f"{slots[0]} sessions per server")


def regime(label: str, servers: Sequence[ServerSpec], model: ModelSpec, *, replay_rate: float,
           design_rate: float, paper_c: int | None = PAPER_C, methods: Sequence[str] = ()) -> Regime:
    """The regime of one testbed: the paper composition at ``design_rate`` (c = ``paper_c``, or tuned if None)."""
    if not (replay_rate > 0 and math.isfinite(replay_rate)):
        raise SpecError(f"replay rate must be > 0 req/s, got {replay_rate!r}")
    if not (design_rate > 0 and math.isfinite(design_rate)):
        raise SpecError(f"design rate must be > 0 req/s, got {design_rate!r}")
    servers = list(servers)
    if paper_c is not None:
        comp = compose_for_c(servers, model, paper_c, design_rate)
    else:
        comp = METHODS["paper"].compose(servers, model, design_rate)
    c = comp.c
    rows = []
    for s in servers:
        m = span_blocks(s.memory_bytes, model, c)
        rows.append(ServerRatios(s.name, m, m / model.num_blocks, c * model.cache_bytes / model.block_bytes,
                                 (model.block_bytes + c * model.cache_bytes) * m / s.memory_bytes,
                                 s.tau_c_s / (s.tau_p_s * model.num_blocks)))
    chains = tuple(tuple(servers[j].name for j, m in zip(ch.servers, ch.blocks) if m > 0) for ch in comp.chains)
    loads = []
    for m in methods:
        rate = design_rate if m == "paper" else replay_rate
        loads.append(method_load(m, servers, model, replay_rate, rate, c=paper_c))
    return Regime(label, model.num_blocks, c, replay_rate, design_rate, tuple(rows), chains,
                  tuple(ch.capacity for ch in comp.chains), tuple(loads))


# ---- the report -----------------------------------------------------------------------------------------------


def _by_kind(reg: Regime, kinds: Mapping[str, str]) -> dict[str, list[ServerRatios]]:
    """Servers grouped by kind (e.g. 3g.40gb / 2g.20gb), in first-seen order."""
    out: dict[str, list[ServerRatios]] = {}
    for r in reg.servers:
        out.setdefault(kinds.get(r.name, "?"), []).append(r)
    return out


def _range(values: Sequence[float], fmt: str) -> str:
    """'x' or 'x–y' of a group's values."""
    lo, hi = min(values), max(values)
    return format(lo, fmt) if math.isclose(lo, hi, rel_tol=1e-3) else f"{format(lo, fmt)}–{format(hi, fmt)}"


def report_rows(ours: Regime, paper: Regime, kinds: Mapping[str, str],
                paper_kinds: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(figure, ours, paper) rows, servers grouped by kind (the i-th kind of ours next to the paper's i-th)."""
    ok, pk = _by_kind(ours, kinds), _by_kind(paper, paper_kinds)
    rows = [("c of the paper composition", str(ours.c), f"{paper.c} (published: {PAPER_C})"),
            ("design rate / replay rate", f"{ours.design_rate_per_s / ours.replay_rate_per_s:.2f}",
             f"{paper.design_rate_per_s / paper.replay_rate_per_s:.2f}")]
    for (k1, g1), (k2, g2) in zip(ok.items(), pk.items()):
        rows += [
            (f"span m_j(c) / L, {k1} vs {k2}",
             f"{_range([r.span_blocks for r in g1], 'd')}/{ours.num_blocks} = "
             f"{_range([r.span_fraction for r in g1], '.2f')}",
             f"{_range([r.span_blocks for r in g2], 'd')}/{paper.num_blocks} = "
             f"{_range([r.span_fraction for r in g2], '.2f')}"),
            (f"cache / weights per server, {k1} vs {k2}", _range([r.cache_to_weights for r in g1], ".2f"),
             _range([r.cache_to_weights for r in g2], ".2f")
             + f" (published {PAPER_CACHE_TO_WEIGHTS[0]:g}–{PAPER_CACHE_TO_WEIGHTS[1]:g})"),
            (f"memory used at c, {k1} vs {k2}", _range([r.memory_used for r in g1], ".2f"),
             _range([r.memory_used for r in g2], ".2f")),
            (f"τc / (τp·L), {k1} vs {k2}", _range([r.comm_to_compute for r in g1], ".2f"),
             _range([r.comm_to_compute for r in g2], ".2f")),
        ]

    def chains_text(reg: Regime, kind: Mapping[str, str]) -> str:
        return "; ".join("+".join(f"{n}({kind.get(n, '?')})" for n in ch) + f" c={cap}"
                         for ch, cap in zip(reg.chains, reg.chain_capacities))

    rows += [("hops of the paper composition's chains", ",".join(map(str, ours.hops())),
              ",".join(map(str, paper.hops()))),
             ("its chains (servers in block order)", chains_text(ours, kinds), chains_text(paper, paper_kinds))]
    pl = {m.method: m for m in paper.loads}
    for m in ours.loads:
        p = pl.get(m.method)
        rows.append((f"load of {METHODS[m.method].label} ({m.how}{', c=' + str(m.c) if m.c else ''})",
                     _load_text(m), _load_text(p) if p is not None else "–"))
    return rows


def _load_text(m: MethodLoad) -> str:
    """Load with the capacity it comes from."""
    if m.how == "infeasible":
        return "infeasible"
    bound = "≥ " if m.how == "block cut" else ""
    return f"{bound}{m.load:.2f} ({m.capacity_per_s:.3g} jobs/s)"


def format_report(rows: Sequence[tuple[str, str, str]], ours_label: str, paper_label: str) -> list[str]:
    """A Markdown table of the rows."""
    out = [f"| figure | {ours_label} | {paper_label} |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return out


# ---- both sides from files (the CLI) ----------------------------------------------------------------------------


def paper_side(cluster_path: str, methods: Sequence[str], *, paper_c: int | None = PAPER_C,
               design_rate_factor: float = PAPER_DESIGN_RATE_FACTOR) -> tuple[Regime, dict[str, str]]:
    """The paper's testbed from its cluster file (τ from the paper's service model), replayed at the trace's rate."""
    import yaml

    from petals_chain.compose.cluster_file import load_cluster

    cl = load_cluster(cluster_path)
    with open(cluster_path) as fh:
        rows = yaml.safe_load(fh)["servers"]
    kinds = {row["name"]: str(row.get("device", "?")).removeprefix("a100-") for row in rows}
    rate = cl.load.arrival_rate
    return regime("paper", cl.servers, cl.model, replay_rate=rate, design_rate=rate * design_rate_factor,
                  paper_c=paper_c, methods=methods), kinds


def emulated_kinds(names: Sequence[str], speed_factors: Sequence[float]) -> dict[str, str]:
    """Emulated servers by the MIG slice they stand in for: the fastest for 3g.40gb, the others for 2g.20gb."""
    top = max(speed_factors)
    return {n: ("3g.40gb stand-in" if math.isclose(f, top) else "2g.20gb stand-in")
            for n, f in zip(names, speed_factors)}


def report_lines(ours: Regime, kinds: Mapping[str, str], paper: Regime, paper_kinds: Mapping[str, str],
                 header: Sequence[str] = ()) -> list[str]:
    """The whole report: a header, the table, and how the loads are defined."""
    lines = list(header)
    lines += format_report(report_rows(ours, paper, kinds, paper_kinds), ours.label, "paper's testbed (our model)")
    lines += ["", "Loads: replay rate / capacity; capacity Σ c_k/T_k over a method's chains, or for a method "
              "without chains (PETALS, BPRR) the block-cut bound min over blocks Σ slots_j / (τc_j + τp_j·m_j) "
              "(an upper bound on capacity, so its load is a lower bound). The paper composition is composed "
              "for the design rate with its fixed c; the others for the replay rate.",
              "Paper side: τ from the paper's service model (docs/model.md, 'Service time'), 2048 in / 28 out "
              "tokens, RIPE RTTs; its published spans are 24/12 of 32 and cache ≈ 2.7–2.9 × weights."]
    return lines
