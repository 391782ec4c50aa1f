"""results/README.md's numbers against the committed files behind them.

Each section an experiment wrote names its command. Where the experiment can redraw from its saved files
(``--replot``), the test reruns that command with ``--replot`` on a copy of results/, and the section's lines must be
exactly what the files give today. Elsewhere they must be the lines its run saved in results/NAME.json. Only lines
marked "(added by hand" and the paper's claims (after "Paper:") are exempt. Sections without an experiment's
command (benchmarks, GPU measurements, the Table 1 report) are not walked here.
"""

from __future__ import annotations

import json

import pytest

from tests.experiments.replotting import COMMITTED, REPLOTTABLE, ROOT, WITH_COMMAND, Replotted


def _lines(section: str) -> list[str]:
    """The section's summary lines: its bullets before "Paper:", without those added by hand."""
    body = section.split("\nPaper:")[0]
    return [line for line in body.splitlines() if line.startswith("- ") and "(added by hand" not in line]


def test_the_walk_covers_most_sections() -> None:
    assert len(REPLOTTABLE) >= 15 and len(WITH_COMMAND) >= 30


@pytest.mark.parametrize("name", REPLOTTABLE)
def test_a_replottable_section_is_what_its_files_give(name: str, replotted: Replotted) -> None:
    assert _lines(COMMITTED[name]) == _lines(replotted.sections[name])


@pytest.mark.parametrize("name", sorted(set(WITH_COMMAND) - set(REPLOTTABLE)))
def test_another_section_is_what_its_run_saved(name: str) -> None:
    saved = ROOT / "results" / f"{name}.json"
    assert saved.is_file(), f"{name}: no results/{name}.json behind the section"
    lines = json.loads(saved.read_text(encoding="utf-8"))["lines"]
    assert _lines(COMMITTED[name]) == ["- " + line for line in lines]
