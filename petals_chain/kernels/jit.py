"""numba's ``njit`` where numba is installed, else a stand-in that leaves the function as plain Python.

numba is an optional dependency (the ``sim`` extra): without it every kernel still runs, slower, with the same
results. ``HAVE_NUMBA`` lets a caller prefer a faster pure-Python path of its own when numba is missing.
"""

from __future__ import annotations

try:
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only where numba is missing
    HAVE_NUMBA = False

    def njit(*args, **kwargs):  # type: ignore[no-redef]
        """Stand-in decorator: return the function unchanged."""
        if args and callable(args[0]):
            return args[0]
        return lambda fn: fn

__all__ = ["HAVE_NUMBA", "njit"]
