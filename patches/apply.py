"""Apply unified diffs (made with `diff -ruN a b`, applied as `patch -p1`) to site-packages, idempotently.

scripts/install.sh uses GNU patch when the machine has it and this file when it does not. A patch whose hunks all
match their pre-image is applied; one whose hunks all match their post-image is reported as already applied; anything
else is an error naming the file and hunk, and no file is written.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(Exception):
    """A patch file is malformed, or does not match the files it targets."""


@dataclass
class Hunk:
    """One `@@` block: the lines before (context and removed) and after (context and added), 1-indexed old start."""

    old_start: int
    old_lines: list[str] = field(default_factory=list)
    new_lines: list[str] = field(default_factory=list)


@dataclass
class FilePatch:
    """All hunks for one target file, its path relative to the -p1 root."""

    path: str
    hunks: list[Hunk] = field(default_factory=list)


def strip_component(header_path: str, line_number: int) -> str:
    """Drop the first path component (like `patch -p1`) of a `---`/`+++` header path and any trailing timestamp."""
    path = header_path.split("\t")[0].strip()
    if path == "/dev/null":
        raise PatchError(f"line {line_number}: creating or deleting files is not supported")
    if "/" not in path:
        raise PatchError(f"line {line_number}: path {path!r} has no leading component to strip")
    return path.split("/", 1)[1]


def parse(text: str) -> list[FilePatch]:
    """Parse a unified diff into per-file hunks; text before the first `---` line is a free-form description."""
    lines = text.splitlines(keepends=True)
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            files.append(FilePatch(strip_component(lines[i + 1][4:], i + 2)))
            i += 2
            continue
        match = HUNK_HEADER.match(line)
        if match:
            if not files:
                raise PatchError(f"line {i + 1}: hunk before any ---/+++ file header")
            old_count = int(match.group(2) or 1)
            new_count = int(match.group(4) or 1)
            hunk = Hunk(int(match.group(1)))
            i += 1
            while (len(hunk.old_lines) < old_count or len(hunk.new_lines) < new_count) and i < len(lines):
                body = lines[i]
                tag, content = body[:1], body[1:]
                if tag == " ":
                    hunk.old_lines.append(content)
                    hunk.new_lines.append(content)
                elif tag == "-":
                    hunk.old_lines.append(content)
                elif tag == "+":
                    hunk.new_lines.append(content)
                elif body.startswith("\\"):
                    pass  # "\ No newline at end of file"
                else:
                    raise PatchError(f"line {i + 1}: unexpected line inside a hunk: {body.rstrip()!r}")
                i += 1
            if len(hunk.old_lines) != old_count or len(hunk.new_lines) != new_count:
                raise PatchError(f"line {i}: hunk ends early (counts in its @@ header do not match)")
            files[-1].hunks.append(hunk)
            continue
        i += 1
    if not files:
        raise PatchError("no ---/+++ file headers found: not a unified diff")
    return files


def find_block(lines: list[str], block: list[str], expected_index: int) -> int:
    """Return where `block` occurs in `lines`, searching outward from `expected_index`; -1 if it does not occur."""
    n = len(block)
    for delta in range(len(lines) + 1):
        for start in (expected_index - delta, expected_index + delta) if delta else (expected_index,):
            if 0 <= start <= len(lines) - n and lines[start : start + n] == block:
                return start
    return -1


def plan_file(root: Path, file_patch: FilePatch, reverse: bool) -> list[str] | None:
    """Return the file's new lines if every hunk's pre-image (post-image when `reverse`) matches, else None."""
    target = root / file_patch.path
    if not target.is_file():
        raise PatchError(f"{file_patch.path}: no such file under {root}")
    lines = target.read_text().splitlines(keepends=True)
    offset = 0
    for hunk in file_patch.hunks:
        before, after = (hunk.new_lines, hunk.old_lines) if reverse else (hunk.old_lines, hunk.new_lines)
        start = find_block(lines, before, max(hunk.old_start - 1 + offset, 0))
        if start < 0:
            return None
        lines[start : start + len(before)] = after
        offset += len(after) - len(before)
    return lines


def status(root: Path, files: list[FilePatch]) -> str:
    """Return 'applicable', 'applied' or 'conflict' for a whole patch against the tree at `root`."""
    if all(plan_file(root, f, reverse=False) is not None for f in files):
        return "applicable"
    if all(plan_file(root, f, reverse=True) is not None for f in files):
        return "applied"
    return "conflict"


def conflict_details(root: Path, files: list[FilePatch]) -> str:
    """Name the files whose hunks match neither the pre-image nor the post-image."""
    bad = [f.path for f in files if plan_file(root, f, False) is None and plan_file(root, f, True) is None]
    return ", ".join(bad) if bad else "a mix of applied and unapplied files"


def apply_patch(root: Path, patch_path: Path, check_only: bool) -> str:
    """Apply one patch file under `root` unless already applied; return what happened, raise PatchError on conflict."""
    files = parse(patch_path.read_text())
    state = status(root, files)
    if state == "conflict":
        raise PatchError(f"{patch_path.name}: does not apply to {root}: {conflict_details(root, files)}")
    if state == "applied":
        return "already applied"
    if check_only:
        return "would apply"
    for file_patch in files:
        new_lines = plan_file(root, file_patch, reverse=False)
        assert new_lines is not None  # status() just checked every file
        (root / file_patch.path).write_text("".join(new_lines))
    return "applied"


def main(argv: list[str] | None = None) -> int:
    """CLI: `python patches/apply.py [--check] ROOT PATCH...`; exit 1 with one line per failing patch."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="directory the patch paths are relative to (site-packages)")
    parser.add_argument("patches", type=Path, nargs="+", help="unified diff files, applied in the given order")
    parser.add_argument("--check", action="store_true", help="only report, write nothing")
    args = parser.parse_args(argv)
    failed = False
    for patch_path in args.patches:
        try:
            print(f"{patch_path.name}: {apply_patch(args.root, patch_path, args.check)}")
        except (PatchError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
