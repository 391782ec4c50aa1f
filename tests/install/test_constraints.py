"""requirements/constraints.txt (written by requirements/lock.sh) agrees with the requirement files it locks."""

from __future__ import annotations

import re
from pathlib import Path

REQ = Path(__file__).resolve().parents[2] / "requirements"
LOCKED_FILES = ("hivemind.txt", "petals-deps.txt", "project.txt", "extra.txt")
# torch and what only torch needs: install.sh lets a GPU user pick another torch build, so none of them is pinned.
# networkx is torch's too, but petals_chain.torta needs it itself (pinned in project.txt): not torch-only.
TORCH_ONLY = ("torch", "sympy", "mpmath", "jinja2", "markupsafe", "triton")


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` requirement line of a file (comments and other specifiers skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)", line)
        if match:
            out[canonical(match.group(1))] = match.group(2)
    return out


def requirement_names(path: Path) -> set[str]:
    """Names of every requirement line of a file."""
    names = set()
    for line in path.read_text().splitlines():
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if match:
            names.add(canonical(match.group(1)))
    return names


def test_constraints_pin_every_requirement_at_its_exact_version() -> None:
    """Each requirement of the locked files is pinned, at the version its file pins when it pins one."""
    locked = pins(REQ / "constraints.txt")
    for file_name in LOCKED_FILES:
        for name in requirement_names(REQ / file_name) - {"setuptools"}:
            assert name in locked, f"{file_name}: {name} is not in constraints.txt (run requirements/lock.sh)"
        for name, version in pins(REQ / file_name).items():
            assert locked[name] == version, f"{file_name} pins {name}=={version}, constraints.txt {locked[name]}"


def test_constraints_leave_torch_and_petals_free() -> None:
    """Neither torch nor what only torch needs is pinned (GPU torch builds differ), nor petals (installed --no-deps)."""
    locked = pins(REQ / "constraints.txt")
    assert not [name for name in locked if name in TORCH_ONLY or name.startswith("nvidia-")]
    assert "petals" not in locked
    assert "bash requirements/lock.sh" in (REQ / "constraints.txt").read_text().split("\n\n")[0]
