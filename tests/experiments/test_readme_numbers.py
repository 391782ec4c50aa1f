"""results/README.md's numbers against the committed files behind them.

Each section an experiment wrote names its command. Where the experiment can redraw from its saved files
(``--replot``), the test reruns that command with ``--replot`` on a copy of results/, and the section's lines must be
exactly what the files give today. Elsewhere they must be the lines its run saved in results/NAME.json. Only lines
marked "(added by hand" and the paper's claims (after "Paper:") are exempt. Sections without an experiment's
command (benchmarks, GPU measurements, the Table 1 report) are not walked here.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from petals_chain.experiments import EXPERIMENTS, load
from petals_chain.experiments.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"Command: `python -m petals_chain\.experiments ([^`]*)`")


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^<!-- (\S+) -->\n", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def _lines(section: str) -> list[str]:
    """The section's summary lines: its bullets before "Paper:", without those added by hand."""
    body = section.split("\nPaper:")[0]
    return [line for line in body.splitlines() if line.startswith("- ") and "(added by hand" not in line]


COMMITTED = _sections((ROOT / "results" / "README.md").read_text(encoding="utf-8"))
WITH_COMMAND = {name: shlex.split(m.group(1)) for name, sec in COMMITTED.items() if (m := COMMAND.search(sec))}


def _replots(argv: list[str]) -> bool:
    return argv[0] in EXPERIMENTS and getattr(load(argv[0]), "REPLOT", False)


@pytest.fixture(scope="module")
def redrawn(tmp_path_factory) -> dict[str, str]:
    """Every replottable section redrawn by its own command (+ --replot) into a copy of results/."""
    out = tmp_path_factory.mktemp("results") / "results"
    shutil.copytree(ROOT / "results", out)
    codes = {}
    for name, argv in WITH_COMMAND.items():
        if _replots(argv):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                codes[name] = main([a for a in argv if a != "--replot"] + ["--replot", "--out", str(out)])
    assert all(code == 0 for code in codes.values()), codes
    return _sections((out / "README.md").read_text(encoding="utf-8"))


def test_the_walk_covers_most_sections() -> None:
    replot = [n for n, argv in WITH_COMMAND.items() if _replots(argv)]
    assert len(replot) >= 15 and len(WITH_COMMAND) >= 30


@pytest.mark.parametrize("name", sorted(n for n, argv in WITH_COMMAND.items() if _replots(argv)))
def test_a_replottable_section_is_what_its_files_give(name: str, redrawn: dict[str, str]) -> None:
    assert _lines(COMMITTED[name]) == _lines(redrawn[name])


@pytest.mark.parametrize("name", sorted(n for n, argv in WITH_COMMAND.items() if not _replots(argv)))
def test_another_section_is_what_its_run_saved(name: str) -> None:
    saved = ROOT / "results" / f"{name}.json"
    assert saved.is_file(), f"{name}: no results/{name}.json behind the section"
    lines = json.loads(saved.read_text(encoding="utf-8"))["lines"]
    assert _lines(COMMITTED[name]) == ["- " + line for line in lines]
