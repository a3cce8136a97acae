"""Window-aware allocation: nodes that the main scheduler takes back within the horizon.

Eq. 16 values an allocation as if every node stayed for T_fwd. When the pool source
knows a node's window w (seconds until the scheduler takes it back, ``Problem.windows_s``),
a trainer holding it gets its throughput only until then and pays a scale-down when it
goes. A trainer given node set S, with windows sorted w_(1) >= ... >= w_(k), is worth
(docs/allocator.md, "Windows")

    V_j(S) = sum_i (O_j(i) - O_j(i-1)) * min(w_(i), T)           # throughput while held
             - O_j(C_j) * R_j                                      # Eq. 16's rescale now
             - R_dw * sum_{tau < H} O_j(n_S(tau-)) * min(1, T / tau)  # one scale-down
                                                                   # per distinct departure

where n_S(t) counts the nodes of S still present at t: the first line is the integral
of O_j(n_S(t)) over [0, T]. Nodes leaving together cost one scale-down, so departures
are best concentrated in one trainer. H = max(T, ``DEPARTURE_HORIZON_S``): a departure
past T_fwd but known within H costs its scale-down too, spread over the stay (weight
T / tau) as the throughput until it is valued over T only. Which trainer holds a node
when it leaves is decided now, and that scale-down is certain; counting it keeps nodes
that leave in minutes out of trainers that hold nodes staying longer (measured on the
Summit week, docs/benchmarks.md, "Windows"). With no window below H this is Eq. 16
exactly.

Nodes are no longer interchangeable, so the exact problem is an assignment of nodes,
not of counts. This module solves it approximately, and every candidate is valued
exactly by V (milp/window_value.py):

1. A trainer that shrinks keeps its longest-window nodes; the nodes free for growth
   (free and released) are sorted by window, longest first, and each grower takes a
   contiguous block of them (so nodes that leave together go to one trainer). The order
   of the growers is searched (every order up to ``MAX_PERMUTED`` growers).
2. Counts come from the exact count DP (``dp.solve_counts``) on window-aware per-count
   tables: trainer j's k-th count is valued with the nodes it would get at that count
   (its own longest, then the growth block at its offset). The offsets are first the
   head of the free list, then the blocks the previous round's mapping gave
   (``ROUNDS``, or until the counts repeat).
3. The best of those rounds, the window-free optimum mapped as in 1, and the current
   map is improved by moving a node to another holder (or to none) or swapping two
   nodes of different windows, while that raises V and keeps no-migration (first
   improvement; at most ``MAX_SWAP_TRIALS`` trials, so the answer does not depend on
   the machine's speed). Swaps that put a node with a holder whose nodes leave at its
   time come first; between maps of equal V, fewer scale-downs for departures known
   past the horizon win. Never worse by V than the current map.

V for the same counts is at most Eq. 16's (when no trainer's value falls with more
nodes), so the window-free optimum bounds it: a map of step 1 or 2 worth that bound
(every node it gives stays past the horizon) is the answer, and what is left of steps
2 and 3 does not run. The
error against an exhaustive search over node maps is measured in
``tests/milp/test_windows.py`` (docs/allocator.md gives the figures).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bftrainer.milp.dp import solve_counts
from bftrainer.milp.objective import TrainerTerms
from bftrainer.milp.problem import Problem
from bftrainer.milp.window_value import (
    TableCache,
    better,
    departure_horizon_s,
    sorted_value,
)

# Rounds of the count DP with offsets from the previous round's mapping.
ROUNDS = 2
# Grower orders: all permutations up to this many growers; beyond it, two heuristics.
MAX_PERMUTED = 4
# Swaps tried by the local search (step 3), at most: about 5 us each.
MAX_SWAP_TRIALS = 2000
# Starts of the local search: the best maps of step 2 (by V). Two found a better map in
# 6 more of the 200 test instances and cost 30 ms more at 30 x 800 (docs/benchmarks.md).
STARTS = 1
# Shortcuts that skip repeated work (issue 39); off only in the tests that check them
# against the long path (tests/milp/test_windows_shortcuts.py).
_MAP_ONCE = True  # a count vector's map, once per allocation
_REMEMBER_CHANGES = True  # the local search's change() answers, per holder's set
_RELEASED_ALWAYS = False  # the others' windows also for trainers that cannot reach them
_AT_THE_BOUND = True  # a candidate's map worth Eq. 16's optimum is the answer


def node_windows(problem: Problem) -> dict[str, float]:
    """Each pool node's window in seconds; inf when open-ended, unknown, or past the
    departure horizon (all alike to V)."""
    t = departure_horizon_s(problem.t_fwd_s)
    # Every node inf, in pool order, then the stated windows (all pool nodes: Problem
    # checks it): one pass over the windows, not a lookup per pool node.
    out = dict.fromkeys(problem.pool, math.inf)
    for n, x in problem.windows_s.items():
        if x is not None and x < t:
            out[n] = float(x)
    return out


def raw_windows(problem: Problem) -> dict[str, float]:
    """Each pool node's window in seconds (inf when open-ended or unknown), uncapped: the
    order in which blocks are cut, so that nodes leaving at about the same time after
    the horizon still go together."""
    out = dict.fromkeys(problem.pool, math.inf)  # as node_windows, without the cap
    for n, x in problem.windows_s.items():
        if x is not None:
            out[n] = float(x)
    return out


def has_windows(problem: Problem) -> bool:
    """True when some pool node leaves within the departure horizon: only then do
    windows matter."""
    t = departure_horizon_s(problem.t_fwd_s)
    for w in problem.windows_s.values():  # noqa: SIM110 (a generator per ~100 windows)
        if w is not None and w < t:
            return True
    return False


@dataclass(frozen=True)
class _Layout:
    """Where each trainer's nodes come from, for one count vector."""

    kept: dict[str, tuple[str, ...]]
    free: list[str]  # free and released nodes, longest window first
    growers: list[str]


def _layout(
    terms: list[TrainerTerms],
    counts: Mapping[str, int],
    pool: Sequence[str],
    w: Mapping[str, float],
    keep_longest: bool = True,
    by_window: bool = False,
) -> _Layout:
    """``by_window``: ``pool`` is already in window order (longest first, stable), so the
    free nodes are read off it in that order instead of sorted again."""
    kept: dict[str, tuple[str, ...]] = {}
    held: set[str] = set()
    growers = []
    sign = -1.0 if keep_longest else 1.0
    for t in terms:
        k = counts.get(t.id, 0)
        if k >= t.c:  # keeps them all: no order to choose by (most trainers)
            kept[t.id] = t.current
            held.update(t.current)
            if k > t.c:
                growers.append(t.id)
            continue
        keep = set(sorted(t.current, key=lambda n: sign * w[n])[:k])
        kept[t.id] = tuple(n for n in t.current if n in keep)  # in their held order
        held |= keep
    if by_window:
        free = [n for n in pool if n not in held]
    else:
        free = sorted((n for n in pool if n not in held), key=lambda n: -w[n])  # stable
    return _Layout(kept, free, growers)


def _assign(
    layout: _Layout, counts: Mapping[str, int], order: Sequence[str]
) -> tuple[dict[str, tuple[str, ...]], dict[str, int]]:
    """Node sets with growers taking consecutive blocks of the free list in ``order``;
    and each grower's block offset."""
    nodes = dict(layout.kept)
    offsets, at = {}, 0
    for tid in order:
        need = counts[tid] - len(layout.kept[tid])
        offsets[tid] = at
        nodes[tid] = layout.kept[tid] + tuple(layout.free[at : at + need])
        at += need
    return nodes, offsets


def map_windows(
    terms: list[TrainerTerms],
    counts: Mapping[str, int],
    pool: Sequence[str],
    w: Mapping[str, float],
    t_fwd_s: float,
    by_window: bool = False,
) -> tuple[dict[str, tuple[str, ...]], dict[str, int]]:
    """Node sets for ``counts`` (step 1 of the module docstring): the best by V of the
    grower orders, with shrinkers keeping their longest windows or (releasing those to
    the growers) their shortest; and each grower's offset in the free list.
    ``by_window``: ``pool`` is in window order (``_layout``)."""
    nodes, offsets, _, _ = _map_windows(terms, counts, pool, w, t_fwd_s, by_window)
    return nodes, offsets


Valued = dict[str, tuple[float, float]]  # sorted_value of each trainer's set, by id


def _map_windows(
    terms: list[TrainerTerms],
    counts: Mapping[str, int],
    pool: Sequence[str],
    w: Mapping[str, float],
    t_fwd_s: float,
    by_window: bool = False,
) -> tuple[dict[str, tuple[str, ...]], dict[str, int], _Layout, Valued]:
    """``map_windows``; the layout of shrinkers keeping their longest windows (the next
    round reads its free list: built once, not again); and the value of each moving
    trainer's set in the map (the map's V sums them with the others': not again)."""
    by_id = {t.id: t for t in terms}
    o = {t.id: t.count_values().tolist() for t in terms}

    def cost(tid: str) -> float:  # the trainer a departure costs most goes first
        t = by_id[tid]
        return -t.rescale_down_s * float(t.value(counts[tid]))

    best: tuple[tuple[float, float], dict[str, tuple[str, ...]], dict[str, int]] | None = None
    valued: Valued = {}
    shrinking = any(counts.get(t.id, 0) < t.c for t in terms)
    moving = [t for t in terms if counts.get(t.id, 0) != t.c]  # the others keep their nodes
    longest: _Layout | None = None
    for keep_longest in (True, False) if shrinking else (True,):
        layout = _layout(terms, counts, pool, w, keep_longest, by_window)
        if longest is None:
            longest = layout
        orders: list[Sequence[str]] = (
            list(itertools.permutations(layout.growers))
            if len(layout.growers) <= MAX_PERMUTED
            else [layout.growers, sorted(layout.growers, key=cost)]
        )
        # A trainer that does not grow holds its kept nodes in every order: valued once.
        growing = set(layout.growers)
        fixed = {
            t.id: sorted_value(t, o[t.id], sorted(w[n] for n in layout.kept[t.id]), t_fwd_s)
            for t in moving
            if t.id not in growing
        }
        # A grower's set is its kept nodes and the block at its offset: its value
        # depends on the offset alone, so it is valued once per offset, not per order.
        at_offset: dict[tuple[str, int], tuple[float, float]] = {}
        for order in orders:
            nodes, offsets = _assign(layout, counts, order)
            v, later = 0.0, 0.0
            for t in moving:
                vl = fixed.get(t.id)
                if vl is None:
                    key = (t.id, offsets[t.id])
                    vl = at_offset.get(key)
                    if vl is None:
                        ws = sorted(w[n] for n in nodes[t.id])
                        vl = at_offset[key] = sorted_value(t, o[t.id], ws, t_fwd_s)
                v, later = v + vl[0], later + vl[1]
            if best is None or better((v, later), best[0]):
                best = ((v, later), nodes, offsets)
                valued = {t.id: fixed.get(t.id) or at_offset[(t.id, offsets[t.id])] for t in moving}
    assert best is not None and longest is not None
    return best[1], best[2], longest, valued


def allocate_windows(
    problem: Problem,
    terms: list[TrainerTerms],
    candidates: Sequence[Mapping[str, int]],
    bound: float | None = None,
) -> tuple[dict[str, tuple[str, ...]], float]:
    """The window-aware allocation (steps 1-3 of the module docstring) and its V.

    ``candidates``: count vectors to consider besides the DP's rounds (the window-free
    optimum, the current map); the first of equals wins, so list the current map first
    to move only when it pays. ``bound``: Eq. 16's optimum (the window-free DP's), which
    no map exceeds: a candidate's map worth it (its nodes all stay past the horizon)
    is taken as it is, without the rounds and the search (``_AT_THE_BOUND``).
    """
    t_fwd = float(problem.t_fwd_s)
    w = node_windows(problem)
    raw = raw_windows(problem)  # values cap windows at the horizon themselves
    pool = problem.pool
    maps: list[tuple[tuple[float, float], dict[str, tuple[str, ...]]]] = []

    # The pool longest window first (stable), once: each layout's free nodes in order.
    # (Descending by window with reverse=True: as stable as ascending by -window, and
    # the same order, without a lambda per node.)
    ordered = sorted(pool, key=raw.__getitem__, reverse=True)

    # The map of each count vector, once: a third of the vectors considered repeat (a
    # round's counts are often the window-free optimum's, or the other variant's), and
    # their map is the same, already among ``maps``.
    mapped: dict[tuple[int, ...], tuple[dict[str, int], _Layout]] = {}
    # The value of each trainer's own nodes, kept: a map's V reads it for every trainer
    # that neither grows nor shrinks (sorted_value of the same windows, once).
    kept: Valued = {}

    def consider(counts: Mapping[str, int]) -> tuple[dict[str, int], _Layout]:
        key = tuple(counts.get(t.id, 0) for t in terms)  # all that map_windows reads
        found = mapped.get(key) if _MAP_ONCE else None
        if found is None:
            nodes, offsets, layout, valued = _map_windows(terms, counts, ordered, raw, t_fwd, True)
            if all(m[1] != nodes for m in maps):
                maps.append((_pair_value(terms, valued, kept, raw, t_fwd), nodes))
            found = mapped[key] = (offsets, layout)
        return found

    for counts in candidates:
        consider(counts)
    if (found := _at_the_bound(maps, bound, terms)) is not None:
        return found
    # Round 0: every trainer grows from the head of the free list, then, past the free
    # nodes, from what the others release: their shortest windows, or their longest.
    held = {n for t in terms for n in t.current}
    free = np.array(sorted((w[n] for n in pool if n not in held), reverse=True))
    own = {t.id: np.array(sorted((w[n] for n in t.current), reverse=True)) for t in terms}
    # The windows the others hold, per trainer, shortest first: all held windows less
    # the trainer's own (the same sorted values as sorting the others' afresh). Only for
    # a trainer that can grow past the free nodes: a table reads the first n_max - C_j
    # windows of its growth, all free ones otherwise (``released``, _RELEASED_ALWAYS).
    past = [t for t in terms if t.n_max - t.c > len(free) or _RELEASED_ALWAYS]
    every = sorted(w[n] for u in terms for n in u.current) if past else []
    others = {t.id: np.array(_without(every, [w[n] for n in t.current])) for t in past}
    # (Only when some trainer could grow past the free nodes.)
    variants = [others, {k: v[::-1] for k, v in others.items()}]
    if all(t.n_max - t.c <= len(free) for t in terms):
        variants = variants[:1]
    cache = TableCache(t_fwd)
    for released in variants:
        growth = {t.id: _growth(free, released.get(t.id)) for t in terms}
        _rounds(terms, ordered, raw, cache, own, growth, consider)
    if (found := _at_the_bound(maps, bound, terms)) is not None:  # a round's map
        return found
    # The local search from each start, the best start first (the first of equals wins).
    maps.sort(key=_start_order)
    best: tuple[dict[str, tuple[str, ...]], tuple[float, float]] | None = None
    for _, nodes in maps[:STARTS]:
        searched = improve_by_swaps(terms, nodes, pool, raw, t_fwd)
        if best is None or better(searched[1], best[1]):
            best = searched
    assert best is not None
    return best[0], best[1][0]


def _at_the_bound(
    maps: list[tuple[tuple[float, float], dict[str, tuple[str, ...]]]],
    bound: float | None,
    terms: list[TrainerTerms],
) -> tuple[dict[str, tuple[str, ...]], float] | None:
    """The best map (as the search orders them) and its V if it is worth ``bound``:
    nothing can raise V, and the search would only break ties on departures past the
    horizon, which are decided again when they come within it. Only where V <= Eq. 16
    holds: no trainer's value falls with more nodes (a node leaving would raise it)."""
    if bound is None or not _AT_THE_BOUND:
        return None
    (v, _), nodes = min(maps, key=_start_order)
    if v < bound - 1e-9 * max(1.0, abs(bound)):
        return None
    if any((np.diff(t.count_values()) < 0).any() for t in terms):
        return None
    return nodes, v


def _start_order(m: tuple[tuple[float, float], object]) -> tuple[float, float]:
    """Maps by V, most first, then by later scale-downs, fewest first."""
    return -m[0][0], m[0][1]


def _pair_value(
    terms: list[TrainerTerms],
    valued: Valued,
    kept: Valued,
    w: Mapping[str, float],
    t_fwd_s: float,
) -> tuple[float, float]:
    """``pair_value`` of a map from its moving trainers' values (``valued``) and each
    other trainer's value on its own nodes (``kept``, filled on first use): the same
    sums, in the same order, of the same values."""
    v, later = 0.0, 0.0
    for t in terms:
        vl = valued.get(t.id) or kept.get(t.id)
        if vl is None:
            o = t.count_values().tolist()
            vl = kept[t.id] = sorted_value(t, o, sorted(w[n] for n in t.current), t_fwd_s)
        v, later = v + vl[0], later + vl[1]
    return v, later


def _growth(free: np.ndarray, released: np.ndarray | None) -> np.ndarray:
    """The windows a trainer grows into: the free ones, then (when it can grow past
    them) what the others release."""
    return free if released is None else np.concatenate([free, released])


def _without(ascending: list[float], values: list[float]) -> list[float]:
    """``ascending`` (sorted) with one occurrence of each of ``values`` removed."""
    if not values:
        return ascending
    out = list(ascending)
    for x in values:
        del out[bisect.bisect_left(out, x)]
    return out


def _rounds(
    terms: list[TrainerTerms],
    pool: Sequence[str],
    w: Mapping[str, float],
    cache: TableCache,
    own: Mapping[str, np.ndarray],
    growth: dict[str, np.ndarray],
    consider: Callable[[Mapping[str, int]], tuple[dict[str, int], _Layout]],
) -> None:
    """Step 2: the count DP on window-aware tables, each round with the growth offsets
    the previous round's mapping gave, until the counts repeat (``pool`` in window
    order, ``_layout``)."""
    seen: list[dict[str, int]] = []
    for _ in range(ROUNDS):
        # The window-aware tables stand for the scores in the DP (its ``tables``).
        tables = [cache.table(t, own[t.id], growth[t.id]) for t in terms]
        counts, _ = solve_counts(terms, len(pool), cache.t_fwd_s, tables=tables)
        if counts in seen:
            break
        seen.append(counts)
        offsets, layout = consider(counts)  # its layout: _layout(..., by_window=True)
        avail = np.array([w[n] for n in layout.free])
        end = sum(counts[g] - len(layout.kept[g]) for g in layout.growers)
        growth = {t.id: avail[offsets[t.id] :] if t.id in offsets else avail[end:] for t in terms}


def improve_by_swaps(
    terms: list[TrainerTerms],
    nodes: Mapping[str, tuple[str, ...]],
    pool: Sequence[str],
    w: Mapping[str, float],
    t_fwd_s: float,
) -> tuple[dict[str, tuple[str, ...]], tuple[float, float]]:
    """Step 3 of the module docstring: the map after improving moves and swaps, and its
    (V, later scale-downs)."""
    by_id = {t.id: t for t in terms}
    sets = {t.id: list(nodes.get(t.id, ())) for t in terms}
    current = {t.id: frozenset(t.current) for t in terms}
    o = {t.id: t.count_values().tolist() for t in terms}  # Python floats, as float(x) gives
    owner: dict[str, str | None] = dict.fromkeys(pool)
    for tid, ns in sets.items():
        for n in ns:
            owner[n] = tid
    # No migration: a set is a subset or a superset of the current nodes.
    extra = {tid: sum(1 for n in ns if n not in current[tid]) for tid, ns in sets.items()}
    missing = {tid: len(current[tid]) - (len(sets[tid]) - extra[tid]) for tid in sets}
    wins = {tid: sorted(w[n] for n in ns) for tid, ns in sets.items()}
    val = {tid: sorted_value(by_id[tid], o[tid], wins[tid], t_fwd_s) for tid in sets}
    scale = 1e-9 * max(1.0, sum(abs(v[0]) for v in val.values() if math.isfinite(v[0])))
    seen: dict[tuple[str, tuple[float, ...]], tuple[float, float]] = {}
    # change()'s answers per holder, while its set stays as it is: the search starts
    # over after each improvement, which changes two sets, and asks the others' again.
    asked: dict[str, dict[tuple[str | None, str | None], tuple | None]] = {t: {} for t in sets}

    def change(tid: str | None, out: str | None, into: str | None) -> tuple | None:
        """``tid``'s set without ``out`` and with ``into``: (tid, ..., new V), or None
        if that would migrate."""
        if tid is None:
            return (None, out, into, [], (0.0, 0.0), 0, 0)
        mine = asked[tid]
        key = (out, into)
        if key in mine and _REMEMBER_CHANGES:
            return mine[key]
        found = mine[key] = _change(tid, out, into)
        return found

    def _change(tid: str, out: str | None, into: str | None) -> tuple | None:
        cur = current[tid]
        e = (
            extra[tid]
            - (out is not None and out not in cur)
            + (into is not None and into not in cur)
        )
        m = missing[tid] + (out is not None and out in cur) - (into is not None and into in cur)
        if e and m:
            return None
        ws = list(wins[tid])
        if out is not None:
            ws.remove(w[out])
        if into is not None:
            bisect.insort(ws, w[into])
        # The same sets come back after each improvement (the search starts over).
        key = (tid, tuple(ws))
        v = seen.get(key)
        if v is None:
            v = seen[key] = sorted_value(by_id[tid], o[tid], ws, t_fwd_s)
        return (tid, out, into, ws, v, e, m)

    holders: list[str | None] = [None, *sets]

    def alike(n: str) -> tuple[str, float, bool]:
        """Nodes alike for a move: same holder, window, and whether the holder has it now."""
        h = owner[n]
        return (str(h), w[n], h is not None and n in current[h])

    classes: dict[tuple[str, float, bool], dict[str, None]] = {}  # ordered sets
    for n in pool:  # alike(n), inline: a call per pool node was most of this setup
        h = owner[n]
        classes.setdefault((str(h), w[n], h is not None and n in current[h]), {})[n] = None
    trials = 0
    improved = True
    while improved and trials < MAX_SWAP_TRIALS:
        improved = False
        reps = [next(iter(members)) for members in classes.values() if members]
        nodes_ = sorted(reps, key=lambda n: (str(owner[n]), w[n], n))

        def candidates(nodes_: list[str]) -> Iterator[tuple[tuple | None, tuple | None]]:
            # First the swaps that match a node to a holder that already has nodes
            # leaving at its time (so that they leave together), then any move or swap.
            leaving: dict[str | None, set[float]] = {h: set() for h in holders}
            at: dict[float, list[str]] = {}
            for n in nodes_:
                if w[n] < math.inf:
                    leaving[owner[n]].add(w[n])
                    at.setdefault(w[n], []).append(n)
            # Each holder's instants sorted once (nothing changes while this runs: an
            # improvement ends it), not once per node.
            instants = {h: sorted(times) for h, times in leaving.items()}
            for x in nodes_:
                for when in instants[owner[x]]:
                    for y in at[when]:
                        if owner[x] != owner[y] and w[x] != w[y]:
                            a = change(owner[x], x, y)
                            yield a, (change(owner[y], y, x) if a is not None else None)
            for x in nodes_:  # a move of x to another holder (or to none)
                for h in holders:
                    if h != owner[x]:
                        a = change(owner[x], x, None)
                        yield a, (change(h, None, x) if a is not None else None)
            for x, y in itertools.combinations(nodes_, 2):  # a swap
                if owner[x] != owner[y] and w[x] != w[y]:
                    a = change(owner[x], x, y)
                    yield a, (change(owner[y], y, x) if a is not None else None)

        for a, b in candidates(nodes_):
            trials += 1
            if trials > MAX_SWAP_TRIALS:
                break
            if a is None or b is None:
                continue
            # sum()'s additions, in its order, without a generator or a loop: a's, b's.
            delta = later = 0.0
            if a[0] is not None:
                was = val[a[0]]
                delta += a[4][0] - was[0]
                later += a[4][1] - was[1]
            if b[0] is not None:
                was = val[b[0]]
                delta += b[4][0] - was[0]
                later += b[4][1] - was[1]
            if not (delta > scale or (delta >= -scale and later < -scale)):
                continue
            for tid, out, into, ws, v, e, m in (a, b):
                if tid is None:
                    continue
                if out is not None:
                    sets[tid].remove(out)
                if into is not None:
                    sets[tid].append(into)
                wins[tid], val[tid], extra[tid], missing[tid] = ws, v, e, m
                asked[tid] = {}
            moved = [n for n in (a[1], a[2]) if n is not None]
            for n in moved:
                del classes[alike(n)][n]
            for tid, out, into, *_ in (a, b):
                if into is not None:
                    owner[into] = tid
                elif out is not None and owner[out] == tid:
                    owner[out] = None
            for n in moved:
                classes.setdefault(alike(n), {})[n] = None
            improved = True
            break
    out = {tid: _in_held_order(by_id[tid], ns) for tid, ns in sets.items()}
    return out, (sum(v[0] for v in val.values()), sum(v[1] for v in val.values()))


def _in_held_order(t: TrainerTerms, ns: list[str]) -> tuple[str, ...]:
    """Kept current nodes in their held order, then the new ones."""
    chosen = set(ns)
    kept = [n for n in t.current if n in chosen]
    held = set(t.current)
    return tuple(kept + [n for n in ns if n not in held])
