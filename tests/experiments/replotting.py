"""results/README.md's experiment sections, and one redraw of every replottable one from its committed files.

Both tests/experiments/test_readme_numbers.py (the sections' lines) and test_plots_readable.py (the figures' layout)
need every replottable experiment rerun with ``--replot`` on a copy of results/; :func:`redraw` does that once and
returns what each needs, so the suite pays for the walk once (``replotted`` in conftest.py, session-scoped).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from petals_chain.experiments import EXPERIMENTS, load
from petals_chain.experiments.__main__ import main
from tests.experiments.figure_layout import layout_problems

ROOT = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"Command: `python -m petals_chain\.experiments ([^`]*)`")


def sections(text: str) -> dict[str, str]:
    """The README's sections by the name in their ``<!-- NAME -->`` marker."""
    parts = re.split(r"^<!-- (\S+) -->\n", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


COMMITTED = sections((ROOT / "results" / "README.md").read_text(encoding="utf-8"))
WITH_COMMAND = {name: shlex.split(m.group(1)) for name, sec in COMMITTED.items() if (m := COMMAND.search(sec))}


def replots(argv: list[str]) -> bool:
    """True when the experiment of ``argv`` can redraw its section and figures from its saved files."""
    return argv[0] in EXPERIMENTS and getattr(load(argv[0]), "REPLOT", False)


REPLOTTABLE = sorted(name for name, argv in WITH_COMMAND.items() if replots(argv))


@dataclass(frozen=True)
class Replotted:
    """What one redraw gave: the README's sections as redrawn, and every saved figure's layout problems (file name
    relative to the results copy → problems, empty when readable)."""

    sections: dict[str, str]
    figures: dict[str, list[str]]


def redraw(out: Path) -> Replotted:
    """Copy results/ to ``out`` and rerun every replottable section's command there with ``--replot``, checking each
    figure's layout as it is saved (the figure is closed after saving)."""
    from matplotlib.figure import Figure

    shutil.copytree(ROOT / "results", out)
    found: dict[str, list[str]] = {}
    codes: dict[str, int] = {}
    save = Figure.savefig

    def checked_save(fig: Any, fname: Any, *args: Any, **kwargs: Any) -> Any:
        found[str(fname)] = layout_problems(fig)
        return save(fig, fname, *args, **kwargs)

    Figure.savefig = checked_save
    try:
        for name in REPLOTTABLE:
            argv = [a for a in WITH_COMMAND[name] if a != "--replot"] + ["--replot", "--out", str(out)]
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                codes[name] = main(argv)
    finally:
        Figure.savefig = save
    assert all(code == 0 for code in codes.values()), codes
    return Replotted(sections((out / "README.md").read_text(encoding="utf-8")),
                     {str(Path(f).relative_to(out)): problems for f, problems in found.items()})
