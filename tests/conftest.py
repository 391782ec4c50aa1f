"""Shared fixtures and instance generators for the tests."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from petals_chain.data import DATA_ENV
from petals_chain.model import ModelSpec, ServerSpec

LIVE_DIR = Path(__file__).parent / "live"
NO_DATA = f"needs the external data folder: set {DATA_ENV} (.ci/run does)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests under tests/live/ are live-swarm tests; tests marked ``data`` skip, saying why, without the data folder."""
    no_data = pytest.mark.skip(reason=NO_DATA) if not os.environ.get(DATA_ENV) else None
    for item in items:
        if LIVE_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.live)
        if no_data is not None and item.get_closest_marker("data") is not None:
            item.add_marker(no_data)


def data_file(name: str) -> Path | None:
    """A file of the external data folder, or None when no folder is configured (those tests are skipped)."""
    folder = os.environ.get(DATA_ENV)
    if not folder or not (Path(folder) / name).is_file():
        return None
    return Path(folder) / name


def worked_example(eps: float = 0.001) -> tuple[list[ServerSpec], ModelSpec]:
    """The paper's §3.1.4 example: five servers, L = 3, s_m = 1, s_c = 0.1."""
    servers = [
        ServerSpec(f"j{i}", 3.0 if i == 2 else 2.0, 2.0 if i == 2 else 1.0, i * eps) for i in range(1, 6)
    ]
    return servers, ModelSpec(3, 1.0, 0.1, name="example")


def random_servers(rng: np.random.Generator, n: int, equal_memory: bool = False) -> list[ServerSpec]:
    """Random servers with memory 2..12 units, τc in [0.1, 2], τp in [0.01, 0.3]."""
    mem = np.full(n, rng.uniform(2, 12)) if equal_memory else rng.uniform(2, 12, n)
    return [
        ServerSpec(f"s{j}", float(mem[j]), float(rng.uniform(0.1, 2)), float(rng.uniform(0.01, 0.3)))
        for j in range(n)
    ]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
