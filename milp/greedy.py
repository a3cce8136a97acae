"""A fast feasible answer for when neither the solver nor the exact DP finished in time.

From a feasible count vector (the current map), give free nodes to the trainer whose
best growth gains most per node, while a growth gains at all. Never worse than where it
starts, and about a millisecond per thousand trainers: the fallback of paper §3.6
("keep the current map") without leaving a thousand free nodes idle.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from bftrainer.milp.objective import TrainerTerms


def grow_greedily(
    terms: list[TrainerTerms],
    pool_size: int,
    t_fwd_s: float,
    start: dict[str, int],
    tables: Sequence[np.ndarray] | None = None,
) -> dict[str, int]:
    """``start`` with free nodes added greedily; ``start`` must be feasible. ``tables``:
    each trainer's value per count (default ``scores(t_fwd_s)``; with slots, also
    ``low_scores``)."""
    counts = dict(start)
    free = pool_size - sum(counts.values())

    def best_move(j: int) -> tuple[float, int, int] | None:
        t = terms[j]
        n = counts[t.id]
        top = min(t.n_max, n + free)
        if top <= n:
            return None
        scores = t.scores(t_fwd_s) if tables is None else tables[j]
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


def best_grown(
    terms: list[TrainerTerms],
    pool_size: int,
    t_fwd_s: float,
    starts: Sequence[dict[str, int]],
    tables: Sequence[np.ndarray] | None = None,
) -> tuple[dict[str, int], float]:
    """The best of ``starts`` (each feasible) grown greedily, and its value: an incumbent
    for the pruned DP (dp.py), which keeps fewer counts the closer it is to the optimum."""
    if tables is None:
        tables = [t.scores(t_fwd_s) for t in terms]
    best: tuple[dict[str, int], float] | None = None
    for start in starts:
        grown = grow_greedily(terms, pool_size, t_fwd_s, start, tables)
        value = sum(float(s[grown[t.id]]) for t, s in zip(terms, tables, strict=True))
        if best is None or value > best[1]:
            best = grown, value
    assert best is not None, "no start given"
    return best
