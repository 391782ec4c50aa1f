"""The micro layer's greedy score (7)–(10) as a live dispatch rule over one region's chains, for comparison with
JFFC: a request takes the free chain of highest score instead of the fastest free one; the queue stays FIFO.

docs/torta.md, "On the swarm: regions". Per chain: Comp_hw (8) = its speed relative to the region's fastest chain
(every chain holds the whole model, so the memory and type factors are 1), Comp_load (9) = exp(−held/c_k),
Comp_locality (10) = exp(−λ(t − last start)) (one model, so Sim = 1 once a chain has served).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from petals_chain.dispatch.base import Start
from petals_chain.dispatch.jffc import JFFC
from petals_chain.torta.micro import load_score, locality_score
from petals_chain.torta.params import DEFAULT, TortaParams


def chain_scores(speed: np.ndarray, busy: np.ndarray, capacities: np.ndarray, last_start_s: np.ndarray,
                 now_s: float, params: TortaParams = DEFAULT) -> np.ndarray:
    """Score (7) of each chain: w1·Comp_hw + w2·Comp_load + w3·Comp_locality."""
    hw = np.minimum(1.0, speed)  # speed relative to the region's fastest chain
    served = np.where(np.isfinite(last_start_s), 0, -1)
    loc = locality_score(0, served, np.where(np.isfinite(last_start_s), last_start_s, 0.0), now_s,
                         params.locality_decay_per_s)
    return params.w_hw * hw + params.w_load * load_score(busy, capacities) + params.w_locality * loc


class GreedyScoreChains(JFFC):
    """JFFC's bookkeeping and FIFO queue, but an arrival takes the free chain of highest score (7)."""

    name = "greedy-score"

    def __init__(self, rates: Sequence[float], capacities: Sequence[int], params: TortaParams = DEFAULT) -> None:
        super().__init__(rates, capacities)
        self.params = params
        self._last = np.full(len(self.rates), -np.inf)

    def on_arrival(self, job: int, now: float = 0.0) -> list[Start]:
        """The free chain of highest score, else the back of the queue."""
        free = np.flatnonzero(self._busy < self._caps)
        if free.size == 0:
            self._queue.append(job)
            return []
        rates = np.asarray(self.rates, dtype=float)
        score = chain_scores(rates[free] / rates.max(), self._busy[free].astype(float),
                             self._caps[free].astype(float), self._last[free], now, self.params)
        k = int(free[int(score.argmax())])
        self.occupy(k)
        self._last[k] = now
        return [Start(job, k)]

    def on_departure(self, job: int, chain: int, now: float = 0.0) -> list[Start]:
        """As JFFC (the head of the queue takes the freed slot), remembering when the chain last started a job."""
        starts = super().on_departure(job, chain, now)
        if starts:
            self._last[chain] = now
        return starts

