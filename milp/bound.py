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

Tighter, and what is used when it is cheap (``bounds_by_count``): fix trainer j at n and
bound the others by their own LP optimum on the K - n nodes left, s_j(n) + LP_-j(K - n).
A count whose bound is below z leaves the model. At 30 trainers x 800 nodes this keeps
30-50 of 1,000-2,000 per-count binaries (the single lambda: about 50), and on 10
identical trainers filling a tight pool 12-30 of 560 (the single lambda: 250-400).
HiGHS' root cut loop, which spent up to 0.4 s closing a 0.005% gap on the full model,
then has little left to do (docs/benchmarks.md, "random instances").
"""

from __future__ import annotations

import itertools
import math

import numpy as np

# Golden-section steps on the convex L(lambda): the bracket shrinks to 0.618^k of its
# width. Any lambda >= 0 gives a valid bound; a closer one only prunes more.
SEARCH_STEPS = 80
# Counts within this share of the terms' size of the cut-off are kept: rounding in the
# sums never removes the optimum (keeping a few more only costs the solver a little).
KEEP_TOLERANCE = 1e-7
# bounds_by_count costs (trainers x all counts): past this, the Lagrangian prunes instead
# (10,000 trainers of n_max 16 would be 1.7e9).
PER_COUNT_MAX_WORK = 5_000_000
# Vectorised passes that thin a table before the exact hull loop (_hull_segments).
HULL_PREFILTER_PASSES = 4
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


def counts_that_can_win(tables: list[np.ndarray], capacity: int, floor: float) -> list[np.ndarray]:
    """Per trainer, the counts that may belong to an answer worth ``floor`` or more, for
    per-count score tables (``TrainerTerms.scores``, or ``low_scores`` with slots).

    Every answer worth ``floor`` or more (sum of counts <= ``capacity``) uses only counts
    returned here; with ``floor`` the value of a feasible answer, so does every optimal
    one. By the bound of each count (``bounds_by_count``) when that is cheap, else by the
    Lagrangian reduced costs.
    """
    flat, counts, starts, sizes = _flatten(tables)
    if len(tables) * len(flat) <= PER_COUNT_MAX_WORK:
        ub = np.concatenate(bounds_by_count(tables, capacity))
        finite = np.where(np.isfinite(flat), np.abs(flat), 0.0)
        scale = float(np.maximum.reduceat(finite, starts).sum()) + abs(floor)
        keep = np.isfinite(flat) & (ub >= floor - KEEP_TOLERANCE * max(1.0, scale))
    else:
        bound, lam = lagrangian_bound(tables, capacity)
        reduced = flat - lam * counts
        best = np.maximum.reduceat(reduced, starts)
        rc = np.repeat(best, sizes) - reduced
        scale = lam * capacity + float(np.abs(best).sum()) + abs(floor)
        slack = bound - floor + KEEP_TOLERANCE * max(1.0, scale)
        keep = np.isfinite(flat) & (rc <= slack)
    return [np.flatnonzero(keep[s : s + k]) for s, k in zip(starts, sizes, strict=True)]


def bounds_by_count(tables: list[np.ndarray], capacity: int) -> list[np.ndarray]:
    """For trainer j at count n: s_j(n) + the LP optimum of the others on capacity - n.

    An upper bound on every feasible answer that gives j n nodes (-inf when n exceeds the
    capacity or j cannot take n). The others' LP optimum is Dantzig's greedy: each starts
    at 0 nodes, and the capacity goes to the segments of their upper concave hulls, the
    steepest first, the last one in part. Tighter than the Lagrangian reduced cost, which
    prices every count at one lambda: at 10 trainers on a tight pool it kept 12-30
    counts where that kept 250-400.
    """
    base = np.array([float(s[0]) for s in tables])
    # Trainers of one table (alike trials: most of a queue of a hundred) have one hull
    # and one bound: the others' segments are the same multiset whichever is left out.
    first_of = _first_alike(tables)
    owner, weight, value = _lp_segments(tables, first_of)
    all_w = np.concatenate(([0.0], np.cumsum(weight)))
    all_v = np.concatenate(([0.0], np.cumsum(value)))
    total_base = float(base.sum())
    out: list[np.ndarray] = []
    for j, s in enumerate(tables):
        if first_of[j] != j:
            out.append(out[first_of[j]])
            continue
        mine = owner == j
        w = all_w - np.concatenate(([0.0], np.cumsum(np.where(mine, weight, 0.0))))
        v = all_v - np.concatenate(([0.0], np.cumsum(np.where(mine, value, 0.0))))
        left = capacity - np.arange(len(s), dtype=float)
        # w repeats where j's own segments were removed: interp takes the first of equal
        # abscissae there, which has the same value, so the result is exact.
        others = total_base - base[j] + np.interp(np.maximum(left, 0.0), w, v)
        out.append(np.where(left >= 0, s + others, -np.inf))
    return out


def lp_rounded_counts(tables: list[np.ndarray], capacity: int) -> np.ndarray:
    """A feasible count per trainer from the LP optimum (Dantzig's greedy, as in
    ``bounds_by_count``) with its one fractional segment dropped: every trainer at a
    vertex of its hull, the counts within ``capacity``. A start for ``grow_greedily``:
    where the greedy from the current map is far from the optimum (a map that must
    shrink some trainers to grow others), this one is close to the LP's value."""
    owner, weight, _ = _lp_segments(tables, _first_alike(tables))
    fits = int(np.searchsorted(np.cumsum(weight), capacity, side="right"))
    taken = np.bincount(owner[:fits], weights=weight[:fits], minlength=len(tables))
    return np.rint(taken).astype(np.int64)


def _lp_segments(
    tables: list[np.ndarray], first_of: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every trainer's hull segments (owner, nodes, value), the steepest first: the
    order in which the LP relaxation buys them. A hull is made once per distinct table
    (``first_of``: ``_first_alike(tables)``)."""
    owner_parts, weight_parts, value_parts = [], [], []
    hulls: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for j, s in enumerate(tables):
        first = first_of[j]
        if first not in hulls:
            hulls[first] = _hull_segments(s)
        dn, dv = hulls[first]
        owner_parts.append(np.full(len(dn), j))
        weight_parts.append(dn)
        value_parts.append(dv)
    owner = np.concatenate(owner_parts).astype(np.intp)
    weight = np.concatenate(weight_parts)
    value = np.concatenate(value_parts)
    order = np.argsort(-value / weight, kind="stable")
    return owner[order], weight[order], value[order]


def _hull_segments(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rising segments (nodes, value) of the upper concave hull of (n, scores[n]) over
    the finite entries, from n = 0: what the LP relaxation can buy of this trainer."""
    ns = np.flatnonzero(np.isfinite(scores))
    x, y = ns.astype(float), scores[ns].astype(float)
    # Only the rising part is used: it ends at the first maximum, and the points past
    # it lie below every chord that reaches it.
    top = int(np.argmax(y))
    x, y = x[: top + 1], y[: top + 1]
    # A point on or below the chord of its neighbours is no vertex of the hull: drop all
    # such points at once, a few times over (vectorised; 385 slots took ~0.15 ms per
    # trainer in the loop below), and leave the loop what remains.
    for _ in range(HULL_PREFILTER_PASSES):
        if len(x) < 3:
            break
        below = (y[1:-1] - y[:-2]) * (x[2:] - x[:-2]) <= (y[2:] - y[:-2]) * (x[1:-1] - x[:-2])
        if not below.any():
            break
        keep = np.concatenate(([True], ~below, [True]))
        x, y = x[keep], y[keep]
    xs = x.tolist()
    ys = y.tolist()
    hull: list[int] = []
    for i in range(len(xs)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b is not above the chord a-i: not on the upper hull
            if (ys[b] - ys[a]) * (xs[i] - xs[a]) <= (ys[i] - ys[a]) * (xs[b] - xs[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    dn, dv = [], []
    for a, b in itertools.pairwise(hull):
        if ys[b] <= ys[a]:  # concave: every later segment falls too
            break
        dn.append(float(xs[b] - xs[a]))
        dv.append(ys[b] - ys[a])
    return np.array(dn), np.array(dv)


def _first_alike(tables: list[np.ndarray]) -> list[int]:
    """Per table, the index of the first table equal to it (same type and entries;
    itself if none before)."""
    first: dict[tuple[str, bytes], int] = {}
    return [first.setdefault((s.dtype.str, s.tobytes()), j) for j, s in enumerate(tables)]


def _flatten(tables: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """All tables end to end (-inf kept), each entry's count, and each table's start."""
    sizes = np.array([len(t) for t in tables])
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.intp)
    flat = np.concatenate(tables).astype(float)
    counts = np.concatenate([np.arange(k, dtype=float) for k in sizes])
    return flat, counts, starts, sizes
