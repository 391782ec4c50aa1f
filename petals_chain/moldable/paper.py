"""The paper's settings and its published Table 1 (docs/moldable.md, "Experiments")."""

from __future__ import annotations

SPEEDUPS: dict[str, tuple[float, ...]] = {"linear": (1.0, 2.0, 3.0, 4.0, 5.0), "sub-linear": (1.0, 1.8, 2.5, 3.0, 3.4)}
REGIMES: dict[str, tuple[float, float]] = {"MF": (0.0, 0.2), "HW": (0.5, 0.1), "super-HW": (2 / 3, 0.1)}
DISTS = ("exp", "det", "erlang", "pareto")
TABLE1_N = 4000
TABLE1_ARRIVALS = 5_000_000
TABLE1_RUNS = 100

# (speed-up, regime) -> per law (exp, det, erlang, pareto): E[D] and P_b as published (greedy(p*), n = 4000)
TABLE1_EXEC: dict[tuple[str, str], tuple[float, ...]] = {
    ("linear", "MF"): (0.2000, 0.2000, 0.2000, 0.1973),
    ("linear", "HW"): (0.2000, 0.2000, 0.2000, 0.1970),
    ("linear", "super-HW"): (0.2000, 0.2000, 0.2000, 0.1971),
    ("sub-linear", "MF"): (0.3782, 0.3782, 0.3782, 0.3708),
    ("sub-linear", "HW"): (0.9930, 0.9937, 0.9933, 0.9621),
    ("sub-linear", "super-HW"): (0.9976, 0.9984, 0.9979, 0.9669),
}
TABLE1_BLOCKING: dict[tuple[str, str], tuple[float, ...]] = {
    ("linear", "MF"): (0.0, 0.0, 0.0, 0.0),
    ("linear", "HW"): (0.0267, 0.0268, 0.0267, 0.0209),
    ("linear", "super-HW"): (0.0274, 0.0274, 0.0274, 0.0219),
    ("sub-linear", "MF"): (0.0204, 0.0202, 0.0203, 0.0149),
    ("sub-linear", "HW"): (0.0126, 0.0126, 0.0126, 0.0041),
    ("sub-linear", "super-HW"): (0.0125, 0.0125, 0.0125, 0.0041),
}


def tolerances(dist: str) -> tuple[float, float]:
    """(P_b, E[D]) tolerance of a reproduction: ±0.0005 each, Pareto ±0.002 and ±0.005."""
    return (0.002, 0.005) if dist == "pareto" else (0.0005, 0.0005)
