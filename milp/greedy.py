"""A fast feasible answer for when neither the solver nor the exact DP finished in time.

From a feasible count vector (the current map), give free nodes to the trainer whose
best growth gains most per node, while a growth gains at all. Never worse than where it
starts, and about a millisecond per thousand trainers: the fallback of paper §3.6
("keep the current map") without leaving a thousand free nodes idle.
"""

from __future__ import annotations

import heapq

import numpy as np

from bftrainer.milp.objective import TrainerTerms


def grow_greedily(
    terms: list[TrainerTerms], pool_size: int, t_fwd_s: float, start: dict[str, int]
) -> dict[str, int]:
    """``start`` with free nodes added greedily; ``start`` must be feasible."""
    counts = dict(start)
    free = pool_size - sum(counts.values())

    def best_move(j: int) -> tuple[float, int, int] | None:
        t = terms[j]
        n = counts[t.id]
        top = min(t.n_max, n + free)
        if top <= n:
            return None
        scores = t.scores(t_fwd_s)
        to = np.arange(n + 1, top + 1)
        gain = (scores[n + 1 : top + 1] - scores[n]) / (to - n)
        k = int(np.argmax(gain))
        if not np.isfinite(gain[k]) or gain[k] <= 0:
            return None
        return -float(gain[k]), j, int(to[k])

    heap = [m for j in range(len(terms)) if (m := best_move(j)) is not None]
    heapq.heapify(heap)
    while heap and free > 0:
        _, j, target = heapq.heappop(heap)
        grow = target - counts[terms[j].id]
        if grow > free:  # the pool ran short since: look again within what is left
            again = best_move(j)
            if again is not None:
                heapq.heappush(heap, again)
            continue
        counts[terms[j].id] = target
        free -= grow
        again = best_move(j)
        if again is not None:
            heapq.heappush(heap, again)
    return counts
