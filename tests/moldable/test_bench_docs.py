"""`python -m petals_chain.bench moldable` runs (small), and every docs/moldable.md section cited exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from petals_chain.bench.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def test_bench_moldable_runs_small(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["moldable", "--n", "200", "--arrivals", "20000", "--classes", "30"]) == 0
    out = capsys.readouterr().out
    assert "M arrivals/s" in out and "Theorem 1" in out and "water-fill, 30 classes" in out
    gap = float(re.search(r"\|ΔD\*\| = (\S+)", out).group(1))
    assert gap < 1e-9


def test_citations_of_docs_moldable_name_its_headings() -> None:
    headings = set(re.findall(r"^## (.+)$", (ROOT / "docs" / "moldable.md").read_text(), flags=re.MULTILINE))
    cited = set()
    for path in (ROOT / "petals_chain").rglob("*.py"):
        for m in re.finditer(r'docs/moldable\.md, ("[^"]+"(?: and "[^"]+")*)', path.read_text()):
            cited |= set(re.findall(r'"([^"]+)"', m.group(1)))
    assert {"Model", "Theorem 1", "Simulator"} <= cited
    assert cited <= headings, cited - headings
