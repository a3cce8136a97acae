"""An exact dynamic program over the ``count`` model: a multiple-choice knapsack.

Each trainer picks one count n in {0} U [n_min, n_max] worth ``scores[n]`` (Eq. 16's
term, exact at integers); the counts share the pool's capacity. ``best[c]`` is the best
total of the trainers so far using at most ``c`` nodes; one numpy pass per (trainer,
count). Ties keep the trainer's current count, so equal-valued moves never cost a
rescale. It is the default solver's fast path and the tests' oracle.
"""

from __future__ import annotations

import numpy as np

from bftrainer.milp.objective import TrainerTerms


def knapsack(
    terms: list[TrainerTerms], capacity: int, t_fwd_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """``best[c]`` for every capacity c in 0..capacity, and each trainer's choice table."""
    best = np.zeros(capacity + 1)
    choices = np.zeros((len(terms), capacity + 1), dtype=np.int32)
    for j, t in enumerate(terms):
        scores = t.scores(t_fwd_s)
        options = [n for n in range(len(scores)) if np.isfinite(scores[n]) and n <= capacity]
        # Current count first: strict improvement is needed to move away from it.
        options.sort(key=lambda n: n != t.c)
        new = np.full(capacity + 1, -np.inf)
        pick = choices[j]
        for n in options:
            cand = np.full(capacity + 1, -np.inf)
            cand[n:] = best[: capacity + 1 - n] + scores[n]
            better = cand > new
            new[better] = cand[better]
            pick[better] = n
        best = new
    return best, choices


def solve_counts(
    terms: list[TrainerTerms], pool_size: int, t_fwd_s: float
) -> tuple[dict[str, int], float]:
    """The optimal count per trainer and its objective value."""
    cap = min(pool_size, sum(t.n_max for t in terms))
    best, choices = knapsack(terms, cap, t_fwd_s)
    counts: dict[str, int] = {}
    c = cap
    for j in range(len(terms) - 1, -1, -1):
        n = int(choices[j, c])
        counts[terms[j].id] = n
        c -= n
    return counts, float(best[cap]) if terms else 0.0
