"""The window-aware value V of a node map (milp/windows.py's module docstring gives
the formula): per trainer, per node set, and per count for the count DP.

Kept apart from the search that milp/windows.py runs over node maps: the search only
compares values, and these functions are the one definition of V that the exhaustive
oracle of tests/milp/test_windows.py checks it against.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

import numpy as np

from bftrainer.milp.objective import TrainerTerms

# Known departures up to this far ahead (or T_fwd, if longer) cost their scale-down in V,
# a departure at tau past T_fwd weighted T_fwd / tau (its cost spread over the stay, as
# throughput is valued over T_fwd only): who holds a node when it leaves is decided now,
# and its scale-down is certain (docs/allocator.md, "Windows").
DEPARTURE_HORIZON_S = 3600.0


def departure_horizon_s(t_fwd_s: float) -> float:
    """How far ahead a known departure's scale-down counts in V."""
    return max(float(t_fwd_s), DEPARTURE_HORIZON_S)


def set_value(
    t: TrainerTerms, windows: Sequence[float], t_fwd_s: float, o: list[float] | None = None
) -> float:
    """V_j of a node set with these windows (the module docstring); -inf if infeasible.
    ``o``: O_j at every whole count, if the caller has it."""
    asc = sorted(math.inf if x is None else float(x) for x in windows)
    return sorted_value(t, t.count_values().tolist() if o is None else o, asc, t_fwd_s)[0]


def sorted_value(
    t: TrainerTerms, o: list[float], asc: list[float], t_fwd_s: float
) -> tuple[float, float]:
    """(V_j, the scale-downs of departures known past T_fwd) for windows sorted
    shortest first (inf: open-ended). The nodes that stay past T_fwd come first in the
    longest-first order, together worth T_fwd x O_j(m): only the nodes that leave
    within T_fwd are walked, and those leaving before the departure horizon add their
    scale-downs (weighted T_fwd / w). The second term is not in V: it only breaks ties
    between maps of equal V, so that nodes leaving together later also go together."""
    k = len(asc)
    if k > t.n_max or (0 < k < t.n_min) or (k and not t.runnable):
        return -math.inf, 0.0
    f = bisect.bisect_left(asc, t_fwd_s)
    value = t_fwd_s * o[k - f]
    for a in range(f):
        i = k - 1 - a  # the position in the longest-first order
        x = asc[a]
        value += (o[i + 1] - o[i]) * x
        if a == 0 or asc[a - 1] < x:  # the first of the nodes leaving at x
            value -= t.rescale_down_s * o[i + 1]
    g = bisect.bisect_left(asc, departure_horizon_s(t_fwd_s), lo=f)
    for a in range(f, g):  # leaving past T_fwd but within the departure horizon
        if a == f or asc[a - 1] < asc[a]:
            value -= t.rescale_down_s * o[k - a] * (t_fwd_s / asc[a])
    if k > t.c:
        value -= t.current_value * t.rescale_up_s
    elif k < t.c:
        value -= t.current_value * t.rescale_down_s
    later = 0.0
    for a in range(f, bisect.bisect_left(asc, math.inf, lo=f)):
        if a == f or asc[a - 1] < asc[a]:
            later += t.rescale_down_s * o[k - a]
    return value, later


class TableCache:
    """score_table's answers within one allocation, by everything they read: trainers
    alike (one model, no nodes: most of a queue at P_jmax 100) with the same windows
    offered share one table, computed once (the same array, not a near copy)."""

    def __init__(self, t_fwd_s: float) -> None:
        self.t_fwd_s = t_fwd_s
        self._keys: dict[str, tuple[object, ...]] = {}
        self._tables: dict[tuple[object, ...], np.ndarray] = {}

    def table(self, t: TrainerTerms, own: np.ndarray, growth: np.ndarray) -> np.ndarray:
        kind = self._keys.get(t.id)
        if kind is None:
            arrays = (t.bp_nodes, t.bp_value, t.packed_value, t.spread_value, t.can_pack)
            kind = (
                t.n_min,
                t.n_max,
                t.c,
                t.rescale_up_s,
                t.rescale_down_s,
                t.runnable,
                t.current_value,
                t.slots_per_node,
                *(None if a is None else (a.dtype.str, a.tobytes()) for a in arrays),
            )
            self._keys[t.id] = kind
        key = (kind, own.tobytes(), growth[: max(t.n_max - len(own), 0)].tobytes())
        found = self._tables.get(key)
        if found is None:
            found = score_table(t, own, growth, self.t_fwd_s)
            found.flags.writeable = False
            self._tables[key] = found
        return found


def score_table(t: TrainerTerms, own: np.ndarray, growth: np.ndarray, t_fwd_s: float) -> np.ndarray:
    """V_j at every count 0..n_max: count k <= C_j keeps the k longest of ``own``
    (sorted longest first); k > C_j adds the first k - C_j windows of ``growth``. The
    vectorised form of :func:`set_value`; -inf where infeasible or growth runs out."""
    kmax = t.n_max
    base = t.scores(t_fwd_s)  # for the feasibility mask and the rescale-now terms
    if kmax == 0:
        return np.array(base, dtype=float)
    c = len(own)
    row = np.concatenate([own, growth[: max(kmax - c, 0)]])[:kmax]
    have = len(row)
    if have < kmax:  # zeros after (np.pad's default, without its generic machinery)
        row = np.concatenate([row, np.zeros(kmax - have)])
    ks = np.arange(kmax + 1)
    cols = np.arange(kmax)
    m = np.where(cols[None, :] < ks[:, None], row[None, :], -1.0)  # -1: no node
    m = -np.sort(-m, axis=1)  # each count's windows, longest first
    o = t.count_values()
    held = np.where(m >= 0, np.minimum(m, t_fwd_s), 0.0)
    value = held @ (o[1:] - o[:-1])
    nxt = np.concatenate([m[:, 1:], np.full((kmax + 1, 1), -1.0)], axis=1)
    leaves = (m >= 0) & (m < departure_horizon_s(t_fwd_s)) & (nxt < m)
    weight = t_fwd_s / np.maximum(m, t_fwd_s)  # 1 within T_fwd, T_fwd / w past it
    value -= t.rescale_down_s * ((leaves * weight) @ o[1:])
    # Eq. 16's rescale-now term, as in the window-free table: base = T O(k) - that term.
    value += base - t_fwd_s * o
    value[ks > have] = -math.inf
    return np.where(np.isfinite(base), value, -math.inf)


def better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """(V, later scale-downs) ``a`` beats ``b``: more V, or as much and fewer later."""
    tol = 1e-9 * max(1.0, abs(a[0]), abs(b[0]))
    return a[0] > b[0] + tol or (a[0] >= b[0] - tol and a[1] < b[1] - tol)


def total_value(
    terms: list[TrainerTerms],
    nodes: Mapping[str, Sequence[str]],
    w: Mapping[str, float],
    t_fwd_s: float,
) -> float:
    """sum_j V_j: the window-aware objective of a node map."""
    return sum(set_value(t, [w[n] for n in nodes.get(t.id, ())], t_fwd_s) for t in terms)


def pair_value(
    terms: list[TrainerTerms],
    nodes: Mapping[str, Sequence[str]],
    w: Mapping[str, float],
    t_fwd_s: float,
) -> tuple[float, float]:
    """(sum_j V_j, later scale-downs) of a node map."""
    v, later = 0.0, 0.0
    for t in terms:
        vj, lj = sorted_value(
            t, t.count_values().tolist(), sorted(w[n] for n in nodes.get(t.id, ())), t_fwd_s
        )
        v, later = v + vj, later + lj
    return v, later
