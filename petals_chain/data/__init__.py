"""Readers of the external data sets (Azure LLM traces, RIPE Atlas latencies) and where to find them.

The data live outside the repository; their folder is given at the command line (``--data-dir``)
or by ``$PETALS_CHAIN_DATA``. No module guesses a location of its own.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "PETALS_CHAIN_DATA"


class DataDirError(FileNotFoundError):
    """No data folder was given, or the one given does not exist."""


def data_dir(path: str | Path | None = None) -> Path:
    """The data folder: ``path`` if given, else ``$PETALS_CHAIN_DATA``; DataDirError if neither names a folder."""
    chosen = path if path is not None else os.environ.get(DATA_ENV)
    if not chosen:
        raise DataDirError(f"no data folder: pass --data-dir DIR or set {DATA_ENV} to the folder holding the "
                           "Azure traces and the RIPE Atlas file")
    folder = Path(chosen)
    if not folder.is_dir():
        raise DataDirError(f"data folder {folder} does not exist (from {'--data-dir' if path else DATA_ENV})")
    return folder


def set_data_dir(path: str | Path | None) -> None:
    """Make ``--data-dir`` the folder every reader uses in this process and its children (a CLI calls this)."""
    if path is not None:
        os.environ[DATA_ENV] = str(data_dir(path))
