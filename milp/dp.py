"""An exact dynamic program over the ``count`` model: a multiple-choice knapsack.

Each trainer picks one count n in {0} U [n_min, n_max] worth ``scores[n]`` (Eq. 16's
term, exact at integers); the counts share the pool's capacity. ``best[c]`` is the best
total of the trainers so far using at most ``c`` nodes; one vectorised pass per
trainer over every (capacity, count) pair. Ties keep the trainer's current count, so
equal-valued moves never cost a rescale. Exact and the fastest solver; the tests' oracle.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from bftrainer.milp.objective import TrainerTerms

# The share of its time the DP runs before it judges its pace (the most it can waste).
PACE_SHARE = 0.05


class DeadlineError(TimeoutError):
    """The DP passed its deadline before it was done (only when given one)."""


def knapsack(
    terms: list[TrainerTerms],
    capacity: int,
    t_fwd_s: float,
    deadline: float | None = None,
    tables: Sequence[np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``best[c]`` for every capacity c in 0..capacity, and each trainer's choice table.

    ``tables``: each trainer's value per count (default ``scores(t_fwd_s)``; with slots,
    also ``low_scores``). ``deadline`` (``time.perf_counter()`` seconds): raise
    :class:`DeadlineError` once the pace so far says it would finish past it.
    """
    best = np.zeros(capacity + 1)
    choices = np.zeros((len(terms), capacity + 1), dtype=np.int32)
    rows = np.arange(capacity + 1)
    began = time.perf_counter()
    first_done = math.nan
    # Give up as soon as the pace says it cannot make it, not at the deadline; but judge
    # the pace only after the first trainer, which pays a fresh process's warm-up, and
    # once a share of the time has passed. Judged from the first trainers, a 10,000-
    # trainer DP that takes 2 s gave up at once in about half of fresh processes.
    judge_from = math.inf if deadline is None else began + PACE_SHARE * (deadline - began)
    for j, t in enumerate(terms):
        if deadline is not None and j:
            now = time.perf_counter()
            late = now > deadline
            if j > 1 and now >= judge_from:
                late = late or now + (now - first_done) * (len(terms) - j) / (j - 1) > deadline
            if late:
                raise DeadlineError(
                    f"the DP would pass its deadline ({j} of {len(terms)} trainers done)"
                )
        scores = (t.scores(t_fwd_s) if tables is None else tables[j])[: capacity + 1]
        k = len(scores)
        # value[c, n] = best[c - n] + scores[n]: n nodes to this trainer, c in all.
        padded = np.concatenate([np.full(k - 1, -np.inf), best])
        value = sliding_window_view(padded, k)[:, ::-1] + scores
        pick = np.argmax(value, axis=1)  # the smallest count among equals
        best = value[rows, pick]
        if t.c < k:  # ...but the current count first: moving must strictly pay
            pick[value[:, t.c] == best] = t.c
        choices[j] = pick
        if j == 0:
            first_done = time.perf_counter()
    return best, choices


def dp_cells(terms: list[TrainerTerms], pool_size: int) -> int:
    """The size of the DP's work, (capacity, count) pairs over all trainers: about
    2 ns each here (100 trainers of n_max 64 on 4,608 nodes: 3e7 pairs in 55 ms)."""
    cap = min(pool_size, sum(t.n_max for t in terms))
    return sum((cap + 1) * (min(t.n_max, cap) + 1) for t in terms)


def solve_counts(
    terms: list[TrainerTerms],
    pool_size: int,
    t_fwd_s: float,
    deadline: float | None = None,
    tables: Sequence[np.ndarray] | None = None,
) -> tuple[dict[str, int], float]:
    """The optimal count per trainer and its objective value (``deadline``, ``tables``:
    see knapsack). ``pool_size`` is the capacity: nodes, or slots with S > 1."""
    cap = min(pool_size, sum(t.n_max for t in terms))
    best, choices = knapsack(terms, cap, t_fwd_s, deadline, tables)
    return _trace_back(terms, choices, cap), float(best[cap]) if terms else 0.0


def _trace_back(terms: Sequence[TrainerTerms], choices: np.ndarray, cap: int) -> dict[str, int]:
    """The count per trainer, read back from the DP's choice table at capacity ``cap``."""
    counts: dict[str, int] = {}
    c = cap
    for j in range(len(terms) - 1, -1, -1):
        n = int(choices[j, c])
        counts[terms[j].id] = n
        c -= n
    return counts


def solve_counts_pruned(
    terms: list[TrainerTerms],
    pool_size: int,
    t_fwd_s: float,
    incumbent: dict[str, int],
    deadline: float | None = None,
    tables: Sequence[np.ndarray] | None = None,
    floor: float | None = None,
) -> tuple[dict[str, int], float]:
    """``solve_counts``, exact too, over only the counts that can win (``bound.py``)
    against ``incumbent``, a feasible count per trainer: every optimal answer uses only
    those. The work is capacity x kept counts, not capacity x n_max: with slots the
    capacity is |N| x S and n_max counts slots (30 x 4,800 x 385 pairs unpruned).

    ``tables``: as in ``knapsack``. ``floor`` (default: the incumbent's value) prunes
    against a higher mark, a value known to be reached otherwise: the answer is then
    the optimum if that is worth ``floor`` or more, else no worse than ``incumbent``.
    """
    from bftrainer.milp.bound import counts_that_can_win

    cap = min(pool_size, sum(t.n_max for t in terms))
    if tables is None:
        tables = [t.scores(t_fwd_s) for t in terms]
    reached = sum(float(s[incumbent.get(t.id, 0)]) for t, s in zip(terms, tables, strict=True))
    kept = counts_that_can_win(list(tables), cap, reached if floor is None else max(floor, reached))
    best = np.zeros(cap + 1)
    choices = np.zeros((len(terms), cap + 1), dtype=np.int32)
    rows = np.arange(cap + 1)
    for j, t in enumerate(terms):
        if deadline is not None and j and time.perf_counter() > deadline:
            raise DeadlineError(f"the DP passed its deadline ({j} of {len(terms)} trainers done)")
        scores = tables[j]
        extra = [n for n in (incumbent.get(t.id, 0), t.c) if n <= min(cap, t.n_max)]
        options = np.union1d(kept[j], extra).astype(np.int64)
        options = options[(options <= cap) & np.isfinite(scores[options])]
        value = np.full((cap + 1, len(options)), -np.inf)
        for i, n in enumerate(options):
            value[n:, i] = best[: cap + 1 - n] + scores[n]
        pick = np.argmax(value, axis=1)  # the smallest count among equals
        best = value[rows, pick]
        current = np.flatnonzero(options == t.c)
        if current.size:  # ...but the current count first: moving must strictly pay
            pick[value[:, current[0]] == best] = current[0]
        choices[j] = options[pick]
    return _trace_back(terms, choices, cap), float(best[cap]) if terms else 0.0
