"""A fixed pool of N GPUs serving a request stream, with or without migration (docs/mell.md, "Finding 3").

Requests wait in one FIFO queue; the head is admitted (best fit on its current KV) when some GPU holds it.
A GPU that outgrows C preempts its most recently admitted request back to the queue's head (it keeps its
tokens and re-prefills them when admitted again). With migration, before preempting or leaving the head
waiting, one running request may move to another GPU to make room; if no single move admits the head, every
running request is re-placed by first fit decreasing when that fits them all. The paper's serving ratio is the
number of requests whose KV cache is held in GPU memory: we report its time average and the completions.

``reserve=True`` is the other pool without migration (Fig 11's BF): a request is admitted only where its final
size (prompt + output) fits, and holds that room from admission, so nothing ever overflows or is preempted.
Which of the two the paper's "without migration" means decides how much migration gains (docs/mell.md).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from petals_chain.mell.workloads import Workload


@dataclass(frozen=True)
class ServingResult:
    """Time-average running requests, completions within the horizon, preemptions and migrations."""

    mean_running: float
    completed: int
    preemptions: int
    migrations: int


def serve_fixed(workload: Workload, n_gpus: int, capacity_tokens: int, *, migrate: bool,
                tokens_per_slot: int, slot_s: float, horizon_s: float, reserve: bool = False) -> ServingResult:
    """Simulate N GPUs for ``horizon_s`` seconds; see the module docstring."""
    if reserve and migrate:
        raise ValueError("reserve=True is a pool without migration: pass migrate=False")
    if n_gpus < 1:
        raise ValueError(f"n_gpus must be >= 1, got {n_gpus}")
    if not horizon_s > 0:
        raise ValueError(f"horizon_s must be > 0, got {horizon_s!r}")
    C = capacity_tokens
    used = np.zeros(n_gpus, dtype=np.int64)
    where: dict[int, int] = {}
    size: dict[int, int] = {}
    left: dict[int, int] = {}
    order: dict[int, int] = {}
    queue: deque[int] = deque()
    nxt = completed = preempt = moves = clock = 0
    running_sum = 0
    slots = int(horizon_s / slot_s)
    arr_slot = np.floor(workload.arrival_s / slot_s).astype(np.int64)

    def place(r: int, g: int) -> None:
        nonlocal clock
        where[r] = g
        used[g] += size[r]
        order[r] = clock
        clock += 1

    def make_room(need: int, avoid: int = -1) -> int:
        """One migration that leaves some GPU with ``need`` free tokens; the GPU, or -1 if none works."""
        nonlocal moves
        for g in np.argsort(C - used)[::-1]:  # GPUs with most free first
            g = int(g)
            if g == avoid:
                continue
            short = need - (C - used[g])
            cands = sorted((size[r], r) for r, h in where.items() if h == g and size[r] >= short)
            for s, r in cands:
                dst = [d for d in range(n_gpus) if d != g and C - used[d] >= s]
                if dst:
                    d = min(dst, key=lambda d: C - used[d])
                    used[g] -= s
                    used[d] += s
                    where[r] = d
                    moves += 1
                    return g
        return -1

    def repack(r: int) -> int:
        """Re-place every running request and r by first fit decreasing; the GPU for r, or -1 if they do not fit."""
        nonlocal moves
        reqs = sorted([*where, r], key=lambda q: -size[q])
        load = np.zeros(n_gpus, dtype=np.int64)
        plan = {}
        for q in reqs:
            fit = np.flatnonzero(C - load >= size[q])
            if not fit.size:
                return -1
            plan[q] = int(fit[0])
            load[plan[q]] += size[q]
        moves += sum(plan[q] != where[q] for q in where)
        for q in where:
            where[q] = plan[q]
        used[:] = load
        used[plan[r]] -= size[r]
        return plan[r]

    for t in range(slots):
        done = [r for r, x in left.items() if x <= 0 and r in where]
        for r in done:
            used[where.pop(r)] -= size.pop(r)
            del left[r], order[r]
        completed += len(done)
        for r in list(where):
            g = min(tokens_per_slot, left[r])
            left[r] -= g
            if not reserve:  # a reserving pool already holds the final size
                size[r] += g
                used[where[r]] += g
        for g in range(n_gpus):
            while used[g] > C:
                if migrate:
                    mine = sorted((size[r], r) for r, h in where.items() if h == g)
                    dst = [(C - used[d], d) for d in range(n_gpus) if d != g]
                    moved = False
                    for s, r in mine:
                        fit = [d for free, d in dst if free >= s]
                        if fit:
                            d = min(fit, key=lambda d: C - used[d])
                            used[g] -= s
                            used[d] += s
                            where[r] = d
                            moves += 1
                            moved = True
                            break
                    if moved:
                        continue
                victim = max((r for r, h in where.items() if h == g), key=order.__getitem__)
                used[g] -= size[victim]
                del where[victim]
                queue.appendleft(victim)
                preempt += 1
        while nxt < workload.n and arr_slot[nxt] <= t:
            size[nxt], left[nxt] = int(workload.prompt_tokens[nxt]), int(workload.output_tokens[nxt])
            if reserve:
                size[nxt] += left[nxt]
            queue.append(nxt)
            nxt += 1
        while queue:
            r = queue[0]
            fits = np.flatnonzero(C - used >= size[r])
            if fits.size:
                g = int(fits[np.argmin((C - used)[fits])])
            elif migrate and (C - used).sum() >= size[r]:
                g = make_room(size[r])
                if g < 0:
                    g = repack(r)
                if g < 0:
                    break
            else:
                break
            queue.popleft()
            place(r, g)
        running_sum += len(where)
    return ServingResult(running_sum / max(slots, 1), completed, preempt, moves)
