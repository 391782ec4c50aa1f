"""Reader of the Azure LLM inference traces (2023): ``TIMESTAMP,ContextTokens,GeneratedTokens`` per request.

Every line is validated; a bad one raises :class:`TraceError` naming the file and the 1-based line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

CODE_TRACE = "azure_llm_2023_code.csv"
CONVERSATION_TRACE = "azure_llm_2023_conv.csv"
TRACE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_TIMESTAMP = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?$")


class TraceError(ValueError):
    """A trace file is malformed; the message names the file and the 1-based line."""


@dataclass(frozen=True)
class Trace:
    """A replayable request trace: arrival times (s from the first request) and token counts."""

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str = ""

    @property
    def n_jobs(self) -> int:
        return int(self.arrival_s.size)


def _parse_timestamp_ns(text: str, where: str) -> int:
    """Exact integer nanoseconds (naive calendar time) of 'YYYY-MM-DD HH:MM:SS[.fffffff]'; TraceError if malformed."""
    m = _TIMESTAMP.match(text)
    if not m:
        raise TraceError(f"{where}: malformed TIMESTAMP {text!r} (expected 'YYYY-MM-DD HH:MM:SS.fffffff')")
    try:
        base = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
    except ValueError as exc:
        raise TraceError(f"{where}: malformed TIMESTAMP {text!r} ({exc})") from None
    frac = (m.group(2) or "").ljust(9, "0")
    whole_s = base.toordinal() * 86400 + base.hour * 3600 + base.minute * 60 + base.second
    return whole_s * 1_000_000_000 + int(frac)


def _parse_tokens(text: str, column: str, where: str) -> int:
    """A non-negative integer token count; TraceError naming the column otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"{where}: {column} {text!r} is not an integer") from None
    if value < 0:
        raise TraceError(f"{where}: {column} is negative ({value})")
    return value


def read_azure_trace(path: str | Path, *, time_scale: float = 1.0, first_n: int | None = None) -> Trace:
    """Read an Azure LLM 2023 trace (``TIMESTAMP,ContextTokens,GeneratedTokens``), validating every line.

    Arrivals are seconds from the first request, multiplied by ``time_scale``
    (0.5 replays twice as fast). ``first_n`` keeps the first N requests (only
    those lines are read). Raises :class:`TraceError` naming the 1-based line
    for missing columns, malformed or decreasing timestamps, and bad token counts.
    """
    path = Path(path)
    if not time_scale > 0:
        raise ValueError(f"read_azure_trace: time_scale must be > 0, got {time_scale!r}")
    if first_n is not None and first_n < 1:
        raise ValueError(f"read_azure_trace: first_n must be >= 1, got {first_n!r}")
    times: list[int] = []
    ins: list[int] = []
    outs: list[int] = []
    with path.open("r", newline="", encoding="utf-8") as fh:
        header = fh.readline().rstrip("\r\n").split(",")
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            raise TraceError(f"{path}:1: header lacks column(s) {', '.join(missing)} (got {','.join(header)!r})")
        idx = [header.index(c) for c in TRACE_COLUMNS]
        for lineno, raw in enumerate(fh, start=2):
            line = raw.rstrip("\r\n")
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            fields = line.split(",")
            if len(fields) != len(header):
                raise TraceError(f"{where}: expected {len(header)} columns ({','.join(header)}), got {len(fields)}")
            t = _parse_timestamp_ns(fields[idx[0]].strip(), where)
            if times and t < times[-1]:
                raise TraceError(f"{where}: TIMESTAMP goes backwards (earlier than line {lineno - 1}); trace unsorted")
            times.append(t)
            ins.append(_parse_tokens(fields[idx[1]].strip(), "ContextTokens", where))
            outs.append(_parse_tokens(fields[idx[2]].strip(), "GeneratedTokens", where))
            if first_n is not None and len(times) >= first_n:
                break
    if not times:
        raise TraceError(f"{path}: no requests after the header")
    since_first_s = np.asarray([t - times[0] for t in times], dtype=np.float64) * 1e-9
    return Trace(since_first_s * time_scale, np.asarray(ins, dtype=np.int64), np.asarray(outs, dtype=np.int64),
                 source=str(path))
