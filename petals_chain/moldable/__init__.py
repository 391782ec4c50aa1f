"""Moldable jobs with a concave speed-up on n identical servers: the exact optimum (Theorem 1), the
schemes greedy(p*) and greedy, the Stein bounds and a numba simulator of the loss system (docs/moldable.md)."""
