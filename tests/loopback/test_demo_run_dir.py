"""The demo writes into a fresh git-ignored run folder: its writer leaves `git status` as it found it."""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from petals_chain.loopback.demo import RUNS_DIR, fresh_run_dir, parse_args, write_outputs

REPO = Path(__file__).resolve().parents[2]


def git_status() -> set[str]:
    """`git status --porcelain --untracked-files=all` of the repository, as a set of lines."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                         text=True, check=True)
    return set(out.stdout.splitlines())


def test_run_folders_are_fresh_and_named_by_utc_time(tmp_path: Path) -> None:
    now = datetime(2026, 11, 23, 3, 4, 5, tzinfo=timezone.utc)
    first, second = fresh_run_dir(tmp_path, now), fresh_run_dir(tmp_path, now)
    assert first.name == "demo-20261123-030405" and second.name == "demo-20261123-030405-2"
    assert first.is_dir() and not any(first.iterdir())
    assert parse_args([]).out is None  # by default the demo makes such a folder under runs/


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_the_demo_writer_leaves_the_git_tree_as_it_was() -> None:
    """Real CSV/JSON/PNG written by the demo's own writer into a default run folder: git sees nothing new."""
    assert RUNS_DIR == REPO / "runs"
    before = git_status()
    out = fresh_run_dir()
    try:
        rows = [{"request": 0, "question": "q", "answer": "a", "lease_id": "L1-x", "chain": "k0", "route": "s1[0:30]",
                 "sent_s": 0.0, "waiting_s": 0.1, "queue_waiting_s": 0.0, "service_s": 1.0, "response_s": 1.1,
                 "new_tokens": 4, "error": ""}]
        (out / "logs").mkdir()
        (out / "logs" / "orchestrator.log").write_text("log\n")
        paths = write_outputs(out, rows, {"requests": rows})
        assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
        assert git_status() == before
    finally:
        shutil.rmtree(out)
