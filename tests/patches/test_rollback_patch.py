"""patches/0003 (start_from_position): applied in the installed petals, reversible to pristine, re-appliable."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import petals
import pytest

ROOT = Path(__file__).resolve().parents[2]
DIFF = ROOT / "patches" / "0003-petals-rollback-start-from-position.diff"


def _applier():
    """patches/apply.py as a module."""
    spec = importlib.util.spec_from_file_location("patch_apply_0003", ROOT / "patches" / "apply.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def site_copy(tmp_path: Path) -> Path:
    """A copy of the installed (patched) petals server package under a fake site-packages."""
    shutil.copytree(Path(petals.__file__).parent / "server", tmp_path / "petals" / "server",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_installed_server_reads_start_from_position(site_copy: Path) -> None:
    """The venv's petals has 0003: re-applying is a no-op, and the field is read before each step's tensors."""
    ap = _applier()
    assert ap.apply_patch(site_copy, DIFF, check_only=False) == "already applied"
    text = (site_copy / "petals" / "server" / "block_functions.py").read_text()
    assert text.index('step_metadata.get("start_from_position")') < text.index("flat_tensors = tuple(")


def test_patch_reverses_to_pristine_and_applies_again(site_copy: Path) -> None:
    """Undone, the file no longer mentions the field; applied again, it is byte-identical to the installed one."""
    ap = _applier()
    (fp,) = ap.parse(DIFF.read_text())
    target = site_copy / fp.path
    patched = target.read_text()
    target.write_text("".join(ap.plan_file(site_copy, fp, reverse=True)))
    assert "start_from_position" not in target.read_text()
    assert ap.apply_patch(site_copy, DIFF, check_only=False) == "applied"
    assert target.read_text() == patched
