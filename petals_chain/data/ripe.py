"""Reader of the RIPE Atlas latency file, and the pairwise RTT rule built on it (docs/model.md, "Network").

The file lists measurements per anchor, not pairs. The RTT between anchors i and j is
``0.3·median_i + 0.3·median_j + 0.01 ms/km · haversine(i, j)``, with ``median_i`` the median
of anchor i's positive latency_m1..m4 values, and 0 between a node and itself.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from petals_chain.data import data_dir
from petals_chain.model import SpecError

RIPE_FILE = "ripe_atlas_eu_rtt.csv"
RIPE_COLUMNS = ("anchor_id", "latency_m1", "latency_m2", "latency_m3", "latency_m4", "latitude", "longitude")
EARTH_RADIUS_KM = 6371.0
LOCAL_SHARE = 0.3  # share of each endpoint's median RTT counted as local delay
DISTANCE_S_PER_KM = 0.01e-3  # 0.01 ms per km of great-circle distance (round trip)


class NetworkDataError(ValueError):
    """The RIPE Atlas file is malformed; the message names the file and the 1-based line."""


@dataclass(frozen=True)
class Anchors:
    """RIPE Atlas anchors, sorted by id: median RTT (s) and position (degrees)."""

    anchor_id: np.ndarray
    median_rtt_s: np.ndarray
    lat_deg: np.ndarray
    lon_deg: np.ndarray

    @property
    def size(self) -> int:
        return int(self.anchor_id.size)


def _float(text: str, column: str, where: str) -> float:
    """A finite float from a CSV cell; NetworkDataError naming the column otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise NetworkDataError(f"{where}: {column} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise NetworkDataError(f"{where}: {column} is not finite ({text!r})")
    return value


def load_ripe_atlas(path: str | Path | None = None) -> Anchors:
    """Read the RIPE Atlas file (default: ``data_dir()/ripe_atlas_eu_rtt.csv``) into per-anchor medians.

    Latencies ≤ 0 are ignored; an anchor with none left is dropped. Missing
    columns, bad numbers and out-of-range coordinates raise NetworkDataError.
    """
    path = Path(path) if path is not None else data_dir() / RIPE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"RIPE Atlas file not found: {path} (set PETALS_CHAIN_DATA to the data folder)")
    rtts: dict[int, list[float]] = {}
    where_at: dict[int, tuple[float, float]] = {}
    with path.open("r", newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, [])
        missing = [c for c in RIPE_COLUMNS if c not in header]
        if missing:
            raise NetworkDataError(f"{path}:1: header lacks column(s) {', '.join(missing)}")
        col = {c: header.index(c) for c in RIPE_COLUMNS}
        for lineno, row in enumerate(reader, start=2):
            if not row or not any(cell.strip() for cell in row):
                continue
            where = f"{path}:{lineno}"
            if len(row) != len(header):
                raise NetworkDataError(f"{where}: expected {len(header)} columns, got {len(row)}")
            try:
                aid = int(row[col["anchor_id"]])
            except ValueError:
                raise NetworkDataError(f"{where}: anchor_id {row[col['anchor_id']]!r} is not an integer") from None
            lat = _float(row[col["latitude"]], "latitude", where)
            lon = _float(row[col["longitude"]], "longitude", where)
            if not (-90 <= lat <= 90 and -180 <= lon <= 180):
                raise NetworkDataError(f"{where}: coordinates ({lat}, {lon}) out of range")
            values = [_float(row[col[f"latency_m{m}"]], f"latency_m{m}", where) for m in range(1, 5)]
            rtts.setdefault(aid, []).extend(v for v in values if v > 0)
            where_at.setdefault(aid, (lat, lon))
    ids = sorted(a for a, v in rtts.items() if v)
    if len(ids) < 2:
        raise NetworkDataError(f"{path}: fewer than two anchors with a positive latency")
    return Anchors(
        anchor_id=np.asarray(ids, dtype=np.int64),
        median_rtt_s=np.asarray([np.median(rtts[a]) * 1e-3 for a in ids]),
        lat_deg=np.asarray([where_at[a][0] for a in ids]),
        lon_deg=np.asarray([where_at[a][1] for a in ids]),
    )


def haversine_km(lat1: np.ndarray, lon1: np.ndarray, lat2: np.ndarray, lon2: np.ndarray) -> np.ndarray:
    """Great-circle distance (km) between points given in degrees; broadcasts."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dphi = p2 - p1
    dlmb = np.radians(lon2) - np.radians(lon1)
    a = np.sin(dphi / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dlmb / 2) ** 2
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0)))


def rtt_matrix_s(anchors: Anchors, index: np.ndarray | None = None) -> np.ndarray:
    """Pairwise RTT (s) among anchors (or the subset ``index``, in that order) by the module's rule; zero diagonal."""
    idx = np.arange(anchors.size) if index is None else np.asarray(index, dtype=np.int64)
    med = anchors.median_rtt_s[idx]
    lat, lon = anchors.lat_deg[idx], anchors.lon_deg[idx]
    dist = haversine_km(lat[:, None], lon[:, None], lat[None, :], lon[None, :])
    rtt = LOCAL_SHARE * med[:, None] + LOCAL_SHARE * med[None, :] + DISTANCE_S_PER_KM * dist
    np.fill_diagonal(rtt, 0.0)
    return rtt


@dataclass(frozen=True)
class Topology:
    """One draw: the orchestrator's anchor and J server anchors; ``rtt_s`` is (J+1)², orchestrator first."""

    orchestrator: int
    servers: np.ndarray
    rtt_s: np.ndarray

    @property
    def server_rtt_s(self) -> np.ndarray:
        """RTT between the orchestrator and each server (s)."""
        return self.rtt_s[0, 1:]


def draw_topology(num_servers: int, rng: np.random.Generator, anchors: Anchors | None = None) -> Topology:
    """Draw J + 1 distinct anchors uniformly (``rng.choice`` without replacement): the first is the orchestrator."""
    anchors = anchors if anchors is not None else load_ripe_atlas()
    if num_servers < 1:
        raise SpecError(f"network: number of servers must be >= 1, got {num_servers}")
    if num_servers + 1 > anchors.size:
        raise SpecError(f"network: {num_servers} servers + 1 orchestrator exceed the {anchors.size} anchors")
    picked = rng.choice(anchors.size, size=num_servers + 1, replace=False)
    return Topology(int(picked[0]), picked[1:].astype(np.int64), rtt_matrix_s(anchors, picked))
