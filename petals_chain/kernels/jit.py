"""numba's ``njit`` where numba is installed, else a stand-in that leaves the function as plain Python.

numba is an optional dependency (the ``sim`` extra): without it every kernel still runs, slower, with the same
results. ``HAVE_NUMBA`` lets a caller prefer a faster pure-Python path of its own when numba is missing.
:func:`entry` is for a caller that calls one compiled function from Python many times with arguments of fixed
types (the live dispatch policies, one event at a time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    from numba import njit, typeof

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only where numba is missing
    HAVE_NUMBA = False

    def njit(*args, **kwargs):  # type: ignore[no-redef]
        """Stand-in decorator: return the function unchanged."""
        if args and callable(args[0]):
            return args[0]
        return lambda fn: fn


def entry(fn: Callable[..., Any], *example: Any) -> Callable[..., Any]:
    """The compiled entry point of the njit function ``fn`` for the argument types of ``example``.

    Calling a numba function from Python goes through its dispatcher, which types every argument and looks the
    overload up on each call: about 0.1 µs per array argument, more than a small decision itself takes. The entry
    point of one compiled overload skips that and only unboxes the arguments, so the caller must always pass
    arguments of exactly the example's types (arrays of the same dtype, layout and dimension; ints for ints) —
    nothing checks them. Without numba (or with ``NUMBA_DISABLE_JIT``) it is ``fn`` itself."""
    compile_ = getattr(fn, "compile", None)
    if not HAVE_NUMBA or compile_ is None:
        return fn
    return compile_(tuple(typeof(a) for a in example))


__all__ = ["HAVE_NUMBA", "entry", "njit"]
