"""Regions of a TORTA scenario: a topohub network (SNDlib / Gabriel) with latencies, demands, GPUs and prices.

docs/torta.md, "Regions": latency = shortest-path km scaled so the diameter equals Table I(a)'s value.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np

from petals_chain.torta.params import DIAMETER_MS, GPU_KINDS, TortaParams

TOPOHUB_KEYS = {"abilene": "sndlib/abilene", "polska": "sndlib/polska", "cost266": "sndlib/cost266",
                "gabriel25": "gabriel/25/0"}
GABRIEL_LON_SPAN = (-10.0, 30.0)  # ⚑ Gabriel positions are synthetic: x is mapped onto this longitude range


class TopologyError(ValueError):
    """Unknown topology name."""


@dataclass(frozen=True)
class Regions:
    """R regions with their latency matrix (s), demand shares, longitudes, prices and servers."""

    name: str
    names: tuple[str, ...]
    latency_s: np.ndarray  # (R, R) one-way, shortest path scaled to the Table I(a) diameter
    demand_share: np.ndarray  # (R,) origin shares of requests (SNDlib demand row sums; uniform for Gabriel)
    longitude_deg: np.ndarray  # (R,)
    price_per_kwh: np.ndarray  # (R,) seeded draw in [price_min, price_max]
    server_region: np.ndarray  # (S,) region of each GPU server
    server_kind: np.ndarray  # (S,) index into GPU_KINDS

    @property
    def n_regions(self) -> int:
        return len(self.names)

    @property
    def n_servers(self) -> int:
        return int(self.server_region.size)

    def servers_per_region(self) -> np.ndarray:
        """S_r: GPU servers in each region."""
        return np.bincount(self.server_region, minlength=self.n_regions)


def topology_graph(name: str) -> tuple[nx.Graph, dict]:
    """The networkx graph (edge attribute ``km``) and raw topohub record of topology ``name``."""
    import topohub

    if name not in TOPOHUB_KEYS:
        raise TopologyError(f"topology: unknown {name!r}; known: {', '.join(TOPOHUB_KEYS)}")
    rec = topohub.get(TOPOHUB_KEYS[name])
    g = nx.Graph()
    for node in rec["nodes"]:
        g.add_node(node["id"], name=node["name"], pos=tuple(node["pos"]))
    for e in rec["edges"]:
        g.add_edge(e["source"], e["target"], km=float(e["dist"]))
    return g, rec


def load_regions(name: str, params: TortaParams, rng: np.random.Generator) -> Regions:
    """Build the regions of ``name``: latency from shortest paths, demands, GPUs of Table I(b), seeded prices."""
    g, rec = topology_graph(name)
    n = g.number_of_nodes()
    km = np.zeros((n, n))
    for src, dist in nx.all_pairs_dijkstra_path_length(g, weight="km"):
        for dst, d in dist.items():
            km[src, dst] = d
    latency_s = km / km.max() * DIAMETER_MS[name] / 1e3
    demand = np.zeros(n)
    for src, row in (rec["graph"].get("demands") or {}).items():
        for dst, v in row.items():
            demand[int(src)] += float(v)
            demand[int(dst)] += float(v)
    share = demand / demand.sum() if demand.sum() > 0 else np.full(n, 1.0 / n)
    pos = np.array([g.nodes[i]["pos"] for i in range(n)], dtype=float)
    if name.startswith("gabriel"):
        x = (pos[:, 0] - pos[:, 0].min()) / max(np.ptp(pos[:, 0]), 1e-9)
        lon = GABRIEL_LON_SPAN[0] + x * (GABRIEL_LON_SPAN[1] - GABRIEL_LON_SPAN[0])
    else:
        lon = pos[:, 0]
    price = rng.uniform(params.price_min, params.price_max, size=n)
    kinds, regions = [], []
    for k, kind in enumerate(GPU_KINDS):
        count = int(rng.integers(kind.count_range[0], kind.count_range[1] + 1))
        kinds.append(np.full(count, k))
        regions.append(rng.integers(0, n, size=count))
    server_kind = np.concatenate(kinds)
    server_region = np.concatenate(regions)
    # every region gets at least one server: move one from the largest region to each empty one
    for r in range(n):
        if not (server_region == r).any():
            big = np.bincount(server_region, minlength=n).argmax()
            server_region[np.flatnonzero(server_region == big)[0]] = r
    order = np.lexsort((server_kind, server_region))
    names = tuple(g.nodes[i]["name"] for i in range(n))
    return Regions(name, names, latency_s, share, lon, price, server_region[order], server_kind[order])
