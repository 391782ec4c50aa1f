"""Every shell script under ``experiments/`` and ``scripts/`` can be run as ``./NAME.sh``: git records its run bit.

The README and the docs call them both as ``bash X.sh`` and as ``X.sh``; a script committed without the bit works
one way only. The mode is read from git's index (``git ls-files -s``), which is what a fresh clone gets, and from
the working tree where git is not available (an exported source tree).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_DIRS = ("experiments", "scripts")
EXECUTABLE_MODE = "100755"


def _scripts() -> list[Path]:
    """The shell scripts of the script folders, at any depth."""
    return sorted(p for d in SCRIPT_DIRS for p in (ROOT / d).rglob("*.sh"))


def _git_modes() -> dict[str, str] | None:
    """Path (relative to the repository) -> git file mode of the script folders, or None outside a git checkout."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    out = subprocess.run(["git", "ls-files", "-s", "--", *SCRIPT_DIRS], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        return None
    modes = {}
    for line in out.stdout.splitlines():
        meta, path = line.split("\t", 1)
        modes[path] = meta.split()[0]
    return modes


def test_there_are_scripts_to_check() -> None:
    """The folders hold scripts (a moved folder would make the next test pass on nothing)."""
    assert len(_scripts()) >= 10


def test_every_shell_script_is_executable() -> None:
    """Each committed ``*.sh`` under experiments/ and scripts/ has its run bit in git's index (on disk where the
    tree is not a git checkout)."""
    modes = _git_modes()
    not_executable = []
    for path in _scripts():
        rel = path.relative_to(ROOT).as_posix()
        if modes is not None:
            if rel not in modes:
                continue  # not committed (a scratch file): not what a clone gets
            if modes[rel] != EXECUTABLE_MODE:
                not_executable.append(f"{rel} (git mode {modes[rel]})")
        elif not os.access(path, os.X_OK):
            not_executable.append(f"{rel} (no run bit on disk)")
    assert not not_executable, ("chmod +x and git update-index --chmod=+x these: " + ", ".join(not_executable))
