"""Every `docs/mell.md, "Section"` citation in the Mell code names a heading of docs/mell.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_citations_name_headings():
    text = (ROOT / "docs" / "mell.md").read_text(encoding="utf-8")
    headings = {m.group(1).strip() for m in re.finditer(r"^#{2,3} (.+)$", text, flags=re.MULTILINE)}
    files = list((ROOT / "petals_chain" / "mell").glob("*.py"))
    files += list((ROOT / "petals_chain" / "experiments").glob("mell_*.py"))
    cited = {}
    for f in files:
        for m in re.finditer(r'docs/mell\.md[`,;:]*\s*"([^"]+)"', f.read_text(encoding="utf-8")):
            cited[m.group(1)] = f.name
    assert len(cited) >= 10
    missing = {c: f for c, f in cited.items() if c not in headings}
    assert not missing, missing
