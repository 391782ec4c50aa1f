"""The live experiments' checkpoints: one JSON record per line, appended as each replication (or cell) finishes,
read back whole on a rerun, so that a run stopped part-way resumes from what it finished (results/resume/, the
file named by ``common.checkpoint_path``; none for a --quick run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["append_record", "read_records"]


def append_record(path: Path | None, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line; nothing without a path."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")


def read_records(path: Path | None) -> list[dict[str, Any]]:
    """Every record the file holds, in order (none without a path or a file)."""
    if path is None or not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]
