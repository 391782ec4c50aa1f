"""patches/apply.py: our petals/hivemind patch applies to pristine files, is idempotent, and refuses conflicts."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import petals
import pytest

ROOT = Path(__file__).resolve().parents[2]
DIFF = ROOT / "patches" / "0001-petals-hivemind-1.1.12-imports.diff"


def _applier():
    spec = importlib.util.spec_from_file_location("patch_apply", ROOT / "patches" / "apply.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def site_copy(tmp_path):
    """A copy of the installed (patched) petals package under a fake site-packages."""
    shutil.copytree(Path(petals.__file__).parent, tmp_path / "petals", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_installed_petals_is_patched_and_reapplying_is_a_no_op(site_copy):
    ap = _applier()
    assert ap.apply_patch(site_copy, DIFF, check_only=False) == "already applied"


def test_patch_applies_to_pristine_files(site_copy):
    ap = _applier()
    files = ap.parse(DIFF.read_text())
    assert len(files) >= 10
    patched = {fp.path: (site_copy / fp.path).read_text() for fp in files}
    for fp in files:  # undo it: the pristine petals 2.2.0.post1 sources
        (site_copy / fp.path).write_text("".join(ap.plan_file(site_copy, fp, reverse=True)))
    sample = files[0].path
    assert (site_copy / sample).read_text() != patched[sample]
    assert ap.apply_patch(site_copy, DIFF, check_only=True) == "would apply"
    assert ap.apply_patch(site_copy, DIFF, check_only=False) == "applied"
    assert {p: (site_copy / p).read_text() for p in patched} == patched


def test_conflicting_file_is_refused_and_nothing_written(site_copy):
    ap = _applier()
    files = ap.parse(DIFF.read_text())
    for fp in files:
        (site_copy / fp.path).write_text("".join(ap.plan_file(site_copy, fp, reverse=True)))
    victim = site_copy / files[-1].path
    victim.write_text("# edited by someone else\n")
    before = (site_copy / files[0].path).read_text()
    with pytest.raises(ap.PatchError, match="does not apply"):
        ap.apply_patch(site_copy, DIFF, check_only=False)
    assert (site_copy / files[0].path).read_text() == before
