"""Every docs/torta.md section that a TORTA module cites is a heading there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r'docs/torta\.md[`,;:]*\s*"([^"]+)"')


def test_torta_citations_name_existing_sections():
    text = (ROOT / "docs" / "torta.md").read_text(encoding="utf-8")
    headings = {m.group(1).strip() for m in re.finditer(r"^#{2,3} (.+)$", text, flags=re.MULTILINE)}
    cited = {}
    for path in [*(ROOT / "petals_chain").rglob("*.py"), *(ROOT / "tests" / "torta").rglob("*.py")]:
        for m in CITATION.finditer(path.read_text(encoding="utf-8")):
            cited.setdefault(m.group(1), []).append(str(path.relative_to(ROOT)))
    assert len(cited) >= 8, "the citation pattern found too few TORTA citations"
    missing = {h: where for h, where in cited.items() if h not in headings}
    assert not missing, f"sections docs/torta.md lacks: {missing}"
