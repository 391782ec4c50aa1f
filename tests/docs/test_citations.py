"""Citations stay true: each docs/model.md section cited names a heading there; nothing cites the old spec."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("petals_chain", "scripts", "experiments", "tests", "docs", "patches", "requirements", "README.md")
SUFFIXES = {".py", ".md", ".sh", ".txt", ".yaml", ".diff"}
CITATION = re.compile(r'docs/model\.md[`,;:]*\s*"([^"]+)"')
# Built from parts so that this file does not match itself.
OLD_SPEC = re.compile("spec" + r"\s*(§|'s\b|eqs?\.)|of the " + "spec" + r"\b|chain-serving-" + "spec")
OUTSIDE_PATHS = re.compile("/" + r"work/|\.\./" + "shared")


def _files() -> list[Path]:
    """The repository's own text files that may carry citations."""
    out = []
    for name in SCANNED:
        path = ROOT / name
        out += [path] if path.is_file() else [p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return out


def _headings() -> set[str]:
    """Section headings of docs/model.md (## and ###)."""
    text = (ROOT / "docs" / "model.md").read_text(encoding="utf-8")
    return {m.group(1).strip() for m in re.finditer(r"^#{2,3} (.+)$", text, flags=re.MULTILINE)}


def test_model_md_citations_name_existing_sections():
    headings = _headings()
    assert {"Conventions", "Cache slots", "Network", "GBP-CR", "GCA", "JFFC", "Response-time bounds"} <= headings
    cited = {}
    for path in _files():
        for m in CITATION.finditer(path.read_text(encoding="utf-8", errors="replace")):
            cited.setdefault(m.group(1), []).append(str(path.relative_to(ROOT)))
    assert cited, "no citation of docs/model.md found: the pattern is broken"
    missing = {h: where for h, where in cited.items() if h not in headings}
    assert not missing, f"cited sections that docs/model.md lacks: {missing}"


def test_no_citation_of_the_old_spec_and_no_paths_outside_the_repository():
    hits = []
    for path in _files():
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OLD_SPEC.search(line) or OUTSIDE_PATHS.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)
