"""Failure reports make a server suspect, not dead; a lease whose reports keep proving false is slowed down.

:class:`FalseReportLimiter` counts, per reporter, the reports the orchestrator's own check found false within a
sliding window; past the limit the reporter's next *false* report is refused (HTTP 429) until the oldest false one
leaves the window. A reporter is one request's line of leases (its job: a replacement lease keeps it), never a label
or an address, which callers can share or forge: only the holder of a lease id can report under it, so one client's
false reports never cost another client its failover. A report the check confirms is never refused.
docs/trust.md, "Failure reports".
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

MAX_FALSE_REPORTS = 3  # false failure reports one reporter may make per window before it is refused
FALSE_REPORT_WINDOW_S = 60.0


def reporter_of(job: int) -> str:
    """Whom a failure report counts against: the request (job) whose lease reported it. The lease id is known only to
    its holder, and a replacement lease keeps the job, so the count follows one client's request and nobody else's."""
    return f"job {job}"


class RateLimitedError(RuntimeError):
    """A reporter made too many false failure reports recently (HTTP 429); ``retry_after_s`` says when to retry."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class FalseReportLimiter:
    """Sliding-window count of false failure reports per reporter (a lease's job, see :func:`reporter_of`)."""

    def __init__(self, clock: Callable[[], float], *, max_false: int = MAX_FALSE_REPORTS,
                 window_s: float = FALSE_REPORT_WINDOW_S) -> None:
        if max_false < 1 or not window_s > 0:
            raise ValueError(f"max_false must be >= 1 and window_s > 0, got {max_false!r}, {window_s!r}")
        self.clock = clock
        self.max_false = max_false
        self.window_s = window_s
        self._false: dict[str, collections.deque[float]] = {}
        self.refused = 0  # reports refused so far (for the log and the tests)

    def _recent(self, reporter: str) -> collections.deque[float]:
        """The reporter's false reports within the window (older ones dropped)."""
        times = self._false.setdefault(reporter, collections.deque())
        cutoff = self.clock() - self.window_s
        while times and times[0] <= cutoff:
            times.popleft()
        if not times:
            del self._false[reporter]
        return times

    def check(self, reporter: str) -> None:
        """RateLimitedError if ``reporter`` already made max_false false reports within the window (called only once
        the check found its report false: a confirmed report is never refused)."""
        times = self._recent(reporter)
        if len(times) >= self.max_false:
            retry = times[0] + self.window_s - self.clock()
            self.refused += 1
            log.warning("failure report by %r refused: %d false reports in the last %g s", reporter, len(times),
                        self.window_s)
            raise RateLimitedError(f"too many false failure reports from {reporter!r} ({len(times)} in "
                                   f"{self.window_s:g} s); retry in {retry:.1f} s", retry)

    def record_false(self, reporter: str) -> int:
        """Count one false report by ``reporter``; return how many it made within the window."""
        self._recent(reporter)
        times = self._false.setdefault(reporter, collections.deque())
        times.append(self.clock())
        return len(times)
