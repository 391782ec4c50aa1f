"""Random request sequences for the Mell tests: sizes that grow, finish and arrive, slot by slot."""

from __future__ import annotations

import numpy as np


def run_sequence(sched, rng: np.random.Generator, steps: int, *, arrivals_per_step: float = 2.0, max_growth: int = 20,
                 max_life: int = 40, tiny_share: float = 0.3, single_op: bool = False, check=None):
    """Drive ``sched`` for ``steps`` slots; call ``check(sched, result)`` after each slot; return the results.

    ``single_op`` makes every slot exactly one operation (one arrival, one departure or one growth).
    """
    C = sched.C
    live: dict[int, list[int]] = {}
    nxt = 0
    out = []
    for _ in range(steps):
        deps, growth, arr = [], {}, {}
        if single_op:
            kind = rng.integers(3) if live else 0
            if kind == 0:
                arr[nxt] = _draw(rng, C, tiny_share)
                live[nxt] = [arr[nxt], int(rng.integers(1, max_life))]
                nxt += 1
            elif kind == 1:
                r = int(rng.choice(list(live)))
                deps.append(r)
                del live[r]
            else:
                r = int(rng.choice(list(live)))
                live[r][0] = min(C, live[r][0] + int(rng.integers(1, C // 6)))
                growth[r] = live[r][0]
        else:
            deps = [r for r, (_, rem) in live.items() if rem <= 0]
            for r in deps:
                del live[r]
            for r, v in live.items():
                v[0] = min(C, v[0] + int(rng.integers(0, max_growth)))
                v[1] -= 1
                growth[r] = v[0]
            for _ in range(rng.poisson(arrivals_per_step)):
                s = _draw(rng, C, tiny_share)
                arr[nxt] = s
                live[nxt] = [s, int(rng.integers(1, max_life))]
                nxt += 1
        res = sched.step(arr, deps, growth, {r: C for r in arr})
        out.append(res)
        if check is not None:
            check(sched, res)
    return out


def _draw(rng: np.random.Generator, C: int, tiny_share: float) -> int:
    if rng.random() < tiny_share:
        return int(rng.integers(1, C // 8 + 1))
    return int(rng.integers(C // 8 + 1, C // 2 + C // 4))
