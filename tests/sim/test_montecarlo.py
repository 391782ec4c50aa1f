"""Monte Carlo driver: seeded replications independent of the worker count, CIs, CSV/JSON output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from petals_chain.sim.montecarlo import (
    PoissonPolicyRun,
    confidence_interval,
    run_replications,
    summarize,
    write_csv,
    write_json,
)

TASK = PoissonPolicyRun((2.0, 0.5), (2, 3), "SED", 2.5, 3000)


def test_confidence_interval_matches_student_t() -> None:
    x = np.random.default_rng(1).normal(5.0, 2.0, 12)
    ci = confidence_interval(x)
    lo, hi = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert (ci.ci_low, ci.ci_high) == pytest.approx((lo, hi))
    assert ci.n == 12 and ci.half_width > 0
    with pytest.raises(ValueError, match="no values"):
        confidence_interval([])


def test_replications_are_reproducible_and_independent_of_workers() -> None:
    serial = run_replications(TASK, 4, seed=3, workers=1, progress=False)
    again = run_replications(TASK, 4, seed=3, workers=1, progress=False)
    assert serial == again
    assert [r["replication"] for r in serial] == [0, 1, 2, 3]
    assert len({r["mean_response_s"] for r in serial}) == 4  # each replication has its own stream
    parallel = run_replications(TASK, 4, seed=3, workers=2, progress=False)
    assert parallel == serial


def test_summaries_are_written_as_csv_and_json(tmp_path: Path) -> None:
    rows = run_replications(TASK, 3, seed=0, workers=1, progress=False)
    summary = summarize(rows)
    assert "mean_response_s" in summary and "replication" not in summary
    assert summary["mean_response_s"].ci_low < summary["mean_response_s"].mean < summary["mean_response_s"].ci_high
    csv_path = write_csv(rows, tmp_path / "out" / "reps.csv")
    assert csv_path.read_text().splitlines()[0].startswith("replication,policy,engine")
    doc = json.loads(write_json(summary, tmp_path / "out" / "summary.json", policy="SED").read_text())
    assert doc["meta"] == {"policy": "SED"}
    assert doc["summary"]["mean_response_s"]["n"] == 3


def test_checkpointed_replications_resume_where_they_stopped(tmp_path: Path) -> None:
    """A run stopped half way (a torn last line included) resumes: only the missing replications run again and the
    rows equal an uninterrupted run's; another task or seed in the same file is not mistaken for this one."""
    full = run_replications(TASK, 4, seed=3, workers=1, progress=False)
    ckpt = tmp_path / "ckpt.jsonl"
    first = run_replications(TASK, 4, seed=3, workers=1, progress=False, checkpoint=ckpt)
    assert first == full and len(ckpt.read_text().splitlines()) == 4
    lines = ckpt.read_text().splitlines()
    ckpt.write_text("\n".join(lines[:2]) + "\n" + lines[2][:25] + "\n")  # killed while writing the third
    calls: list[int] = []

    class Counting(PoissonPolicyRun):
        def __call__(self, seed, r):
            calls.append(r)
            return super().__call__(seed, r)

    counting = Counting(*[getattr(TASK, f) for f in TASK.__dataclass_fields__])
    other = run_replications(counting, 4, seed=3, workers=1, progress=False, checkpoint=ckpt)
    assert sorted(calls) == [0, 1, 2, 3] and other == full  # another task (its repr differs): nothing reused
    calls.clear()
    ckpt.write_text("\n".join(lines[:2]) + "\n" + lines[2][:25])
    Counting.__repr__ = lambda self: repr(TASK)  # the same task as far as the checkpoint can tell
    resumed = run_replications(counting, 4, seed=3, workers=1, progress=False, checkpoint=ckpt)
    assert sorted(calls) == [2, 3] and resumed == full
    calls.clear()
    assert run_replications(counting, 4, seed=3, workers=1, progress=False, checkpoint=ckpt) == full and not calls
    assert run_replications(TASK, 4, seed=4, workers=1, progress=False, checkpoint=ckpt) != full


def test_experiment_checkpoints_are_for_full_runs_of_the_same_code() -> None:
    from types import SimpleNamespace

    from petals_chain.experiments.common import checkpoint_path, code_digest

    code = "petals_chain.experiments.fig8_overall"
    assert checkpoint_path("fig8", SimpleNamespace(quick=True, seed=1), code) is None  # quick runs always recompute
    path = checkpoint_path("fig8", SimpleNamespace(quick=False, seed=1), code)
    assert path is not None and path.parent.parts[-2:] == ("results", "resume")  # committed: runs span sessions
    assert path.name == f"fig8-seed1-{code_digest(loaded_only=True, code=code)}.jsonl"
    assert code_digest() == code_digest() and len(code_digest()) == 16


def test_checkpoint_digest_follows_the_modules_a_run_imported(monkeypatch):
    """Only the code a run imported keys its checkpoint: dropping one loaded module changes the digest, and the
    whole-package digest is a different (wider) key."""
    import sys

    import petals_chain.moldable.kernel  # noqa: F401  (a module the moldable experiments run)
    from petals_chain.experiments.common import code_digest

    before = code_digest(loaded_only=True)
    assert before == code_digest(loaded_only=True) and before != code_digest()
    monkeypatch.delitem(sys.modules, "petals_chain.moldable.kernel")
    assert code_digest(loaded_only=True) != before


def test_a_subset_of_replications_has_the_seeds_and_checkpoint_rows_of_the_whole(tmp_path: Path) -> None:
    full = run_replications(TASK, 4, seed=3, workers=1, progress=False)
    ckpt = tmp_path / "ckpt.jsonl"
    part = run_replications(TASK, 4, seed=3, workers=1, progress=False, checkpoint=ckpt, only=[3, 1, 3])
    assert part == [full[1], full[3]] and len(ckpt.read_text().splitlines()) == 2
    assert run_replications(TASK, 4, seed=3, workers=1, progress=False, checkpoint=ckpt) == full
    assert len(ckpt.read_text().splitlines()) == 4  # the whole run computed only the two missing ones
    for bad in ([], [4], [-1], ["1"]):
        with pytest.raises(ValueError, match="only must name replications in 0..3"):
            run_replications(TASK, 4, seed=3, workers=1, progress=False, only=bad)


def test_checkpoint_digest_leaves_out_the_entry_modules_the_replications_do_not_run(monkeypatch):
    """The entry module of another experiment (one that only draws) does not key a checkpoint; the module named as
    the replications' code does, and so does an entry module that code imports."""
    import sys

    import petals_chain.experiments.fig7_c_star  # noqa: F401  (an entry module; it imports fig6_c_curve's c_curve)
    import petals_chain.experiments.torta_common  # noqa: F401
    from petals_chain.experiments.common import code_digest

    torta = "petals_chain.experiments.torta_common"
    fig7 = "petals_chain.experiments.fig7_c_star"
    with_entries = code_digest(loaded_only=True, code=torta)
    assert with_entries != code_digest(loaded_only=True)  # fig6/fig7 are loaded but left out of TORTA's key
    for entry in ("petals_chain.experiments.fig7_c_star", "petals_chain.experiments.fig6_c_curve"):
        monkeypatch.delitem(sys.modules, entry)
    assert code_digest(loaded_only=True, code=torta) == with_entries
    monkeypatch.undo()
    fig7_key = code_digest(loaded_only=True, code=fig7)
    monkeypatch.delitem(sys.modules, "petals_chain.experiments.fig6_c_curve")  # fig7 imports it: part of its key
    assert code_digest(loaded_only=True, code=fig7) != fig7_key


def test_the_modules_an_import_runs_include_package_inits_and_relative_imports(tmp_path):
    """What keys a checkpoint follows imports as Python runs them: a package's ``__init__`` (and what it imports),
    relative imports; not a module nothing on the way imports."""
    from petals_chain.experiments.common import modules_reached

    files = {"pkg/__init__.py": "", "pkg/run.py": "from .lib import f\n",
             "pkg/lib/__init__.py": "from pkg.lib.core import g\nfrom . import extra\n",
             "pkg/lib/core.py": "import os\n", "pkg/lib/extra.py": "from ..entry_a import x\n",
             "pkg/entry_a.py": "", "pkg/entry_b.py": "", "pkg/other/__init__.py": "import pkg.entry_b\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    reached = modules_reached("pkg.run", tmp_path)
    assert {"pkg", "pkg.run", "pkg.lib", "pkg.lib.core", "pkg.lib.extra", "pkg.entry_a"} <= reached
    assert not {"pkg.entry_b", "pkg.other"} & reached and "os" not in reached
