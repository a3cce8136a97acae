"""The LP bound of the ``count`` model, and the counts it proves cannot beat a known answer.

The count model is a multiple-choice knapsack: trainer j picks one count n worth
s_j(n) (Eq. 16's term, ``TrainerTerms.scores``), and the counts share the pool's
capacity K. Pricing a node at lambda >= 0 splits it (weak Lagrangian duality): every
feasible choice (n_j) has

    sum_j s_j(n_j)  <=  L(lambda) - rc_j(n_j)  for each j,
    L(lambda) = lambda * K + sum_j max_n (s_j(n) - lambda * n),
    rc_j(n)   = max_m (s_j(m) - lambda * m) - (s_j(n) - lambda * n)  >= 0,

since sum_j n_j <= K. min over lambda of L is the LP relaxation's optimum (the per-count
encoding is the convex hull of each trainer's choices). So once a feasible answer of
value z is known (the exact DP's), a count with rc_j(n) > L(lambda) - z belongs to no
answer better than z and can leave the model: the optimum stays in it, whatever lambda.
At 30 trainers x 800 nodes this keeps about 50 of 1,000-2,000 per-count binaries, and
HiGHS' root cut loop, which spent up to 0.4 s closing a 0.005% gap on the full model,
has little left to do (docs/benchmarks.md, "random instances").
"""

from __future__ import annotations

import math

import numpy as np

from bftrainer.milp.objective import TrainerTerms

# Golden-section steps on the convex L(lambda): the bracket shrinks to 0.618^k of its
# width. Any lambda >= 0 gives a valid bound; a closer one only prunes more.
SEARCH_STEPS = 80
# Counts within this share of the terms' size of the cut-off are kept: rounding in the
# sums never removes the optimum (keeping a few more only costs the solver a little).
KEEP_TOLERANCE = 1e-7
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def lagrangian_bound(tables: list[np.ndarray], capacity: int) -> tuple[float, float]:
    """``(min L(lambda), lambda)`` over lambda >= 0, for per-count score tables.

    Each table holds s_j(0..n_max_j), -inf for counts a trainer cannot take; s_j(0) is
    finite (waiting is always allowed).
    """
    flat, counts, starts, sizes = _flatten(tables)

    def L(lam: float) -> float:
        return lam * capacity + float(np.maximum.reduceat(flat - lam * counts, starts).sum())

    # Past the steepest average gain of any count over 0, every trainer's best is 0
    # nodes and L only grows: the minimum lies in [0, hi].
    base = np.repeat(flat[starts], sizes)
    with np.errstate(invalid="ignore", divide="ignore"):
        slopes = (flat - base) / counts
    finite = slopes[np.isfinite(slopes)]
    hi = max(float(finite.max()), 0.0) if finite.size else 0.0
    lo = 0.0
    a, b = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
    la, lb = L(a), L(b)
    for _ in range(SEARCH_STEPS):
        if la <= lb:  # a minimiser lies in [lo, b]
            hi, b, lb = b, a, la
            a = hi - _GOLDEN * (hi - lo)
            la = L(a)
        else:  # ...in [a, hi]
            lo, a, la = a, b, lb
            b = lo + _GOLDEN * (hi - lo)
            lb = L(b)
    candidates = [(L(0.0), 0.0), (la, a), (lb, b)]
    return min(candidates)


def counts_that_can_win(
    terms: list[TrainerTerms], capacity: int, t_fwd_s: float, floor: float
) -> list[np.ndarray]:
    """Per trainer, the counts that may belong to an answer worth ``floor`` or more.

    ``floor`` must be the value of a feasible answer (sum of counts <= ``capacity``):
    then every optimal answer uses only counts returned here.
    """
    tables = [t.scores(t_fwd_s) for t in terms]
    bound, lam = lagrangian_bound(tables, capacity)
    flat, counts, starts, sizes = _flatten(tables)
    reduced = flat - lam * counts
    best = np.maximum.reduceat(reduced, starts)
    rc = np.repeat(best, sizes) - reduced
    scale = lam * capacity + float(np.abs(best).sum()) + abs(floor)
    slack = bound - floor + KEEP_TOLERANCE * max(1.0, scale)
    keep = np.isfinite(flat) & (rc <= slack)
    return [np.flatnonzero(keep[s : s + k]) for s, k in zip(starts, sizes, strict=True)]


def _flatten(tables: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """All tables end to end (-inf kept), each entry's count, and each table's start."""
    sizes = np.array([len(t) for t in tables])
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.intp)
    flat = np.concatenate(tables).astype(float)
    counts = np.concatenate([np.arange(k, dtype=float) for k in sizes])
    return flat, counts, starts, sizes
