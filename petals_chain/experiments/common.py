"""What every experiment shares: output folder, CSV writing, the results README, plot styling."""

from __future__ import annotations

import ast
import csv
import hashlib
import json
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.sim.montecarlo import confidence_interval

REPO = Path(__file__).resolve().parents[2]
RESUME_DIR = REPO / "results" / "resume"  # full runs' finished replications (checkpoint_path)


def code_digest(loaded_only: bool = False, code: str | None = None) -> str:
    """A digest of the package's source files: every one, or (``loaded_only``) those of the modules imported so far,
    which for a running experiment are the code it runs: a checkpoint is reused only by the very same code. With
    ``code`` (the module that runs the replications), the experiments' entry modules (:data:`EXPERIMENTS`) other
    than ``code`` and those it imports are left out: they draw and summarise, and several figures drawn from one
    evaluation (TORTA's) must find the same checkpoint whichever of them runs it."""
    if loaded_only:
        skip = set() if code is None else _entries_not_run_by(code)
        names = {m.__file__ for k, m in list(sys.modules.items())
                 if (k == "petals_chain" or k.startswith("petals_chain.")) and getattr(m, "__file__", None)
                 and k not in skip}
        paths = sorted(Path(f).resolve() for f in names if f.endswith(".py"))
    else:
        paths = sorted((REPO / "petals_chain").rglob("*.py"))
    h = hashlib.sha256()
    for path in paths:
        h.update(path.relative_to(REPO).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _entries_not_run_by(code: str) -> set[str]:
    """The experiments' entry modules that ``code`` neither is nor imports (directly or through other modules of
    this package, read from their source)."""
    from petals_chain.experiments import EXPERIMENTS

    return {f"{__package__}.{m}" for m in EXPERIMENTS.values()} - modules_reached(code, REPO)


def modules_reached(code: str, root: Path) -> set[str]:
    """The modules of ``code``'s top-level package that importing ``code`` runs, by reading the sources under
    ``root``: those it imports by name or relatively, the ``__init__`` of every package on the way (importing a.b.c
    runs a and a.b first), and so on through each of them."""
    top = code.split(".")[0]
    reached: set[str] = set()
    todo = [code]
    while todo:
        name = todo.pop()
        if name in reached or name.split(".")[0] != top:
            continue
        reached.add(name)
        todo += [".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1)]  # its parent packages
        base = root / name.replace(".", "/")
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if path.is_file():
            todo += _imported_modules(path, name if path.name == "__init__.py" else name.rpartition(".")[0])
    return reached


def _imported_modules(path: Path, package: str) -> list[str]:
    """Every module a source file of ``package`` imports (``import a.b``, ``from a.b import c``: a.b and a.b.c;
    ``from .b import c`` resolved against ``package``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            out += [module] + [f"{module}.{a.name}" for a in node.names]
    return out


def checkpoint_path(name: str, args: Any, code: str) -> Path | None:
    """Where a full (not --quick) run keeps its finished replications so that a rerun of the same code resumes.
    They live under results/resume/, committed with the results: a run of several CPU-hours may span machines and
    sessions, and the rows are the raw per-replication data behind the figures. The file name carries the digest
    of the modules the run has imported (less the entry modules of other experiments than ``code``, the module that
    runs the replications: see :func:`code_digest`), so changed code never reuses stale rows while edits elsewhere
    in the package do not throw hours of runs away."""
    if args.quick:
        return None
    return RESUME_DIR / f"{name}-seed{args.seed}-{code_digest(loaded_only=True, code=code)}.jsonl"


@dataclass
class Summary:
    """Headline results of one experiment run, for results/README.md and the closing notes."""

    name: str
    title: str
    command: str
    lines: list[str] = field(default_factory=list)
    paper: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


def write_csv(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write dict rows as CSV (columns from the first row)."""
    rows = list(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        if not rows:
            return path
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows written by :func:`write_csv`, numbers read back as floats (for ``--replot``)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no saved results to redraw (run the experiment without --replot first)")

    def value(text: str) -> Any:
        try:
            return float(text)
        except ValueError:
            return text

    with path.open(newline="") as fh:
        return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def backend(args: Any) -> dict[str, Any]:
    """Where an experiment's replications run, as ``run_replications`` keywords: ``--workers`` local processes, or
    Ray tasks on the cluster of ``--ray`` (results and checkpoints are the same either way)."""
    return {"workers": getattr(args, "workers", None), "ray": getattr(args, "ray", None)}


def replotting(args: Any) -> bool:
    """True when the run should redraw its PNG from the saved CSV instead of simulating (``--replot``)."""
    return bool(getattr(args, "replot", False))


def mean_ci(values: Iterable[float], level: float = 0.95) -> tuple[float, float]:
    """Sample mean and the half-width of its Student-t confidence interval at ``level`` (NaN for < 2 values)."""
    a = np.asarray(list(values), dtype=float)
    if a.size == 0:
        return float("nan"), float("nan")
    if a.size == 1:
        return float(a[0]), float("nan")
    ci = confidence_interval(a, level)
    return ci.mean, ci.half_width


def update_readme(out_dir: Path, summary: Summary) -> Path:
    """Insert or replace this experiment's section in out_dir/README.md (sections ordered by name)."""
    path = out_dir / "README.md"
    head = "# Results\n\nWritten by `python -m petals_chain.experiments NAME`; each section says the command.\n"
    text = path.read_text() if path.exists() else head
    sections = dict(re.findall(r"(?ms)^<!-- ([\w-]+) -->\n(.*?)(?=^<!-- [\w-]+ -->|\Z)", text))
    body = [f"## {summary.name}: {summary.title}", "", f"Command: `{summary.command}`", ""]
    if (out_dir / f"{summary.name}.png").is_file():  # a summary without a figure (fig8 --cells) links none
        body += [f"![{summary.name}]({summary.name}.png)", ""]
    body += [f"- {line}" for line in summary.lines]
    if summary.paper:
        body += ["", "Paper:"] + [f"- {line}" for line in summary.paper]
    sections[summary.name] = "\n".join(body) + "\n\n"
    out = head + "\n" + "".join(f"<!-- {k} -->\n{sections[k]}" for k in sorted(sections))
    path.write_text(out)
    (out_dir / f"{summary.name}.json").write_text(json.dumps(
        {"name": summary.name, "command": summary.command, "lines": summary.lines, "data": summary.data},
        indent=2, default=float))
    return path


def publish(out_dir: Path, summary: Summary, elapsed_s: float | None = None) -> None:
    """Record the experiment in out_dir/README.md (and its JSON), then print its headline lines."""
    update_readme(out_dir, summary)
    took = f" ({elapsed_s:.1f} s)" if elapsed_s is not None else ""
    print(f"== {summary.name}: {summary.title}{took}")
    for line in summary.lines:
        print(f"   {line}")


def plt():
    """matplotlib.pyplot on the Agg backend with readable defaults."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    pyplot.rcParams.update({"figure.dpi": 110, "font.size": 10, "axes.grid": True, "grid.alpha": 0.3,
                            "legend.fontsize": 9})
    return pyplot


def figure(nrows: int = 1, ncols: int = 1, **kw: Any) -> tuple[Any, Any]:
    """``pyplot.subplots`` with constrained layout and ``squeeze=False``: titles, axis labels, a caption
    (``fig.supxlabel``) and a legend placed outside the panels (``fig.legend(loc="outside upper center")``) all
    get their own room instead of being drawn over each other or over the data."""
    return plt().subplots(nrows, ncols, layout="constrained", squeeze=False, **kw)


def save_figure(fig: Any, path: Path) -> Path:
    """Lay out (unless the figure has a layout engine of its own), write and close a figure (closing frees its
    memory in long runs); returns ``path``."""
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fig.savefig(path)
    plt().close(fig)
    return path
