"""Fixtures of the experiment tests."""

from __future__ import annotations

import pytest

from tests.experiments.replotting import Replotted, redraw


@pytest.fixture(scope="session")
def replotted(tmp_path_factory: pytest.TempPathFactory) -> Replotted:
    """Every replottable section of results/README.md redrawn once from its committed files (replotting.py)."""
    return redraw(tmp_path_factory.mktemp("replot") / "results")
