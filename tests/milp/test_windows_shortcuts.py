"""The window-aware allocator's shortcuts (issue 39: a year replayed in minutes) change
no decision: what they skip gives what running it gives, to the last bit.

- per-count tables shared by alike trainers (``_TableCache``) against each computed;
- the others' windows as all held windows less one's own (``_without``) against sorting
  the others' afresh;
- free nodes read off the pool sorted once (``_layout(by_window=True)``) against sorting
  them each time.
"""

from __future__ import annotations

import bisect
import itertools
import random

import numpy as np
import pytest

import bftrainer.milp.window_value as wv
import bftrainer.milp.windows as win
from bftrainer.milp import Problem, TrainerSpec, allocate
from bftrainer.milp.objective import TrainerTerms, build_terms


def queue_problem(seed: int) -> Problem:
    """A replay's queue: a few trainers hold nodes, the rest of one model wait; some
    nodes leave at a few shared instants within the horizon."""
    rng = random.Random(seed)
    pool = tuple(f"n{i:02d}" for i in range(rng.randint(20, 48)))
    free = list(pool)
    rng.shuffle(free)
    curve = ((1.0, 100.0), (8.0, 700.0), (16.0, 1200.0))
    trainers = []
    for k in range(rng.randint(6, 16)):
        held = 0 if k >= 4 else rng.randint(0, 8)
        nodes, free = tuple(sorted(free[:held])), free[held:]
        trainers.append(
            TrainerSpec(
                id=f"t{k:02d}",
                n_min=rng.choice([1, 1, 2]),
                n_max=16,
                rescale_up_s=18.0,
                rescale_down_s=12.0,
                curve=curve,
                nodes=nodes,
            )
        )
    instants = [None, None, None, 30.0, 90.0, 400.0, 2000.0, 5000.0]
    windows = {n: rng.choice(instants) for n in pool}
    return Problem(pool=pool, trainers=tuple(trainers), t_fwd_s=120.0, windows_s=windows)


def computed_each_time(
    self: wv.TableCache, t: object, own: np.ndarray, growth: np.ndarray
) -> np.ndarray:
    return wv.score_table(t, own, growth, self.t_fwd_s)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(12))
def test_shared_tables_give_the_allocation_of_tables_computed_each_time(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    problem = queue_problem(seed)
    assert win.has_windows(problem)
    shared = allocate(problem, solver="dp")
    monkeypatch.setattr(wv.TableCache, "table", computed_each_time)
    each = allocate(problem, solver="dp")
    assert shared.status == each.status == "windows"
    assert dict(shared.nodes) == dict(each.nodes)
    assert shared.objective == each.objective


def test_a_shared_table_is_the_table_computed_afresh() -> None:
    problem = queue_problem(1)
    terms = build_terms(problem)
    cache = wv.TableCache(120.0)
    growth = np.array([np.inf, np.inf, 5000.0, 400.0, 400.0, 90.0, 30.0] * 4)
    waiting = [t for t in terms if not t.current]
    tables = {t.id: cache.table(t, np.array([], float), growth) for t in waiting}
    for t in waiting:  # alike (the same n_min too): computed once, the same array
        alike = [u for u in waiting if u.n_min == t.n_min]
        assert all(tables[u.id] is tables[t.id] for u in alike)
    assert len({id(x) for x in tables.values()}) == len({t.n_min for t in waiting})
    for t in terms:
        own = np.array(sorted((float(i) for i in range(len(t.current))), reverse=True))
        got = cache.table(t, own, growth)
        want = wv.score_table(t, own, growth, 120.0)
        assert got.tobytes() == want.tobytes()
        assert not got.flags.writeable  # shared: nobody may change it


def test_all_held_windows_less_ones_own_are_the_others_sorted_afresh() -> None:
    rng = random.Random(0)
    for _ in range(200):
        held = [[rng.choice([30.0, 90.0, 400.0, np.inf]) for _ in range(rng.randint(0, 6))]]
        held += [[rng.choice([30.0, 90.0, np.inf]) for _ in range(rng.randint(0, 6))]]
        every = sorted(x for ws in held for x in ws)
        for j, own in enumerate(held):
            others = sorted(x for i, ws in enumerate(held) if i != j for x in ws)
            assert win._without(every, own) == others
    assert bisect.bisect_left([1.0], 1.0) == 0  # (the removal finds the first equal)


@pytest.mark.parametrize("seed", range(6))
def test_free_nodes_off_the_sorted_pool_are_the_free_nodes_sorted(seed: int) -> None:
    problem = queue_problem(seed)
    terms = build_terms(problem)
    w = win.raw_windows(problem)
    ordered = sorted(problem.pool, key=lambda n: -w[n])
    rng = random.Random(seed)
    for _ in range(20):
        counts = {t.id: rng.randint(0, t.c + 3) for t in terms}
        for keep_longest in (True, False):
            fresh = win._layout(terms, counts, problem.pool, w, keep_longest)
            read = win._layout(terms, counts, ordered, w, keep_longest, by_window=True)
            assert read == fresh


def layout_sorting_each(
    terms: list[TrainerTerms],
    counts: dict[str, int],
    pool: tuple[str, ...],
    w: dict[str, float],
    keep_longest: bool,
) -> win._Layout:
    """``_layout`` as it was: every trainer's nodes sorted by window, kept ones or not."""
    kept: dict[str, tuple[str, ...]] = {}
    held: set[str] = set()
    growers = []
    sign = -1.0 if keep_longest else 1.0
    for t in terms:
        k = counts.get(t.id, 0)
        keep = set(sorted(t.current, key=lambda n: sign * w[n])[: min(k, t.c)])
        kept[t.id] = tuple(n for n in t.current if n in keep)
        held |= keep
        if k > t.c:
            growers.append(t.id)
    free = sorted((n for n in pool if n not in held), key=lambda n: -w[n])
    return win._Layout(kept, free, growers)


@pytest.mark.parametrize("seed", range(6))
def test_a_trainer_keeping_all_its_nodes_keeps_them_unsorted(seed: int) -> None:
    """``_layout`` skips the sort for a trainer that keeps every node it holds."""
    problem = queue_problem(seed)
    terms = build_terms(problem)
    w = win.raw_windows(problem)
    rng = random.Random(seed)
    for _ in range(20):
        counts = {t.id: rng.randint(0, t.c + 3) for t in terms}
        for keep_longest in (True, False):
            got = win._layout(terms, counts, problem.pool, w, keep_longest)
            assert got == layout_sorting_each(terms, counts, problem.pool, w, keep_longest)


def test_count_values_are_the_curve_at_every_count_computed_once() -> None:
    for t in build_terms(queue_problem(3)):
        fresh = np.asarray(t.value(np.arange(t.n_max + 1)), dtype=float)
        got = t.count_values()
        assert got.tobytes() == fresh.tobytes() and not got.flags.writeable
        assert t.count_values() is got
        assert t.scores(60.0).tobytes() == t.eq16_terms(60.0, fresh.copy()).tobytes()


@pytest.mark.parametrize("seed", range(6))
def test_node_windows_from_the_stated_ones_are_those_looked_up_per_node(seed: int) -> None:
    problem = queue_problem(seed)
    for t_fwd in (120.0, 4000.0):  # a horizon of 3,600 s, then of T_fwd
        p = Problem(problem.pool, problem.trainers, t_fwd_s=t_fwd, windows_s=problem.windows_s)
        h = wv.departure_horizon_s(t_fwd)
        capped = {
            n: np.inf if (x := p.windows_s.get(n)) is None or x >= h else float(x) for n in p.pool
        }
        raw = {n: np.inf if (x := p.windows_s.get(n)) is None else float(x) for n in p.pool}
        for got, want in ((win.node_windows(p), capped), (win.raw_windows(p), raw)):
            assert got == want and list(got) == list(want)  # in pool order too


def test_the_pool_in_window_order_is_the_stable_sort_by_minus_the_window() -> None:
    rng = random.Random(5)
    for _ in range(50):
        pool = [f"n{i:03d}" for i in range(rng.randint(0, 60))]
        raw = {n: rng.choice([np.inf, 30.0, 90.0, 0.0, -0.0, 400.0]) for n in pool}
        want = sorted(pool, key=lambda n: -raw[n])
        assert sorted(pool, key=raw.__getitem__, reverse=True) == want


def map_windows_valuing_each_order(
    terms: list[TrainerTerms],
    counts: dict[str, int],
    pool: list[str],
    w: dict[str, float],
    t_fwd_s: float,
) -> tuple[dict[str, tuple[str, ...]], dict[str, int]]:
    """``map_windows`` as it was: every moving trainer valued afresh in every order."""
    by_id = {t.id: t for t in terms}
    o = {t.id: t.count_values().tolist() for t in terms}

    def cost(tid: str) -> float:
        t = by_id[tid]
        return -t.rescale_down_s * float(t.value(counts[tid]))

    best = None
    shrinking = any(counts.get(t.id, 0) < t.c for t in terms)
    moving = [t for t in terms if counts.get(t.id, 0) != t.c]
    for keep_longest in (True, False) if shrinking else (True,):
        layout = win._layout(terms, counts, pool, w, keep_longest, True)
        orders = (
            list(itertools.permutations(layout.growers))
            if len(layout.growers) <= win.MAX_PERMUTED
            else [layout.growers, sorted(layout.growers, key=cost)]
        )
        for order in orders:
            nodes, offsets = win._assign(layout, counts, order)
            v, later = 0.0, 0.0
            for t in moving:
                vj, lj = wv.sorted_value(t, o[t.id], sorted(w[n] for n in nodes[t.id]), t_fwd_s)
                v, later = v + vj, later + lj
            if best is None or wv.better((v, later), best[0]):
                best = ((v, later), nodes, offsets)
    assert best is not None
    return best[1], best[2]


@pytest.mark.parametrize("seed", range(8))
def test_trainers_that_do_not_grow_valued_once_give_the_same_map(seed: int) -> None:
    problem = queue_problem(seed)
    terms = build_terms(problem)
    raw = win.raw_windows(problem)
    ordered = sorted(problem.pool, key=lambda n: -raw[n])
    rng = random.Random(seed)
    for _ in range(30):
        counts = {t.id: rng.choice([0, t.c, max(t.c - 2, 0), t.c + 3]) for t in terms}
        counts = {k: min(v, 16) for k, v in counts.items()}
        got = win.map_windows(terms, counts, ordered, raw, 120.0, by_window=True)
        assert got == map_windows_valuing_each_order(terms, counts, ordered, raw, 120.0)


@pytest.mark.parametrize("seed", range(10))
def test_the_window_aware_shortcuts_give_the_allocation_of_the_long_path(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repeated count vector is not mapped again, the local search reuses a holder's
    change() answers until its set changes, and the others' windows are listed only for
    trainers that can grow past the free nodes: the same nodes, the same V, to the bit,
    as mapping every vector, asking every change afresh and listing them for all."""
    problem = queue_problem(seed)
    short = allocate(problem, solver="dp")
    monkeypatch.setattr(win, "_MAP_ONCE", False)
    monkeypatch.setattr(win, "_REMEMBER_CHANGES", False)
    monkeypatch.setattr(win, "_RELEASED_ALWAYS", True)
    long = allocate(problem, solver="dp")
    assert short.status == long.status == "windows"
    assert dict(short.nodes) == dict(long.nodes)
    assert short.objective == long.objective


@pytest.mark.parametrize("seed", range(6))
def test_improve_by_swaps_with_remembered_changes_is_the_search_asking_afresh(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    problem = queue_problem(seed)
    terms = build_terms(problem)
    raw = win.raw_windows(problem)
    rng = random.Random(seed)
    for _ in range(5):  # from random maps without migration: many improvements each
        nodes = random_map(terms, problem.pool, rng)
        monkeypatch.setattr(win, "_REMEMBER_CHANGES", True)
        short = win.improve_by_swaps(terms, nodes, problem.pool, raw, 120.0)
        monkeypatch.setattr(win, "_REMEMBER_CHANGES", False)
        long = win.improve_by_swaps(terms, nodes, problem.pool, raw, 120.0)
        assert short == long


def random_map(
    terms: list[TrainerTerms], pool: tuple[str, ...], rng: random.Random
) -> dict[str, tuple[str, ...]]:
    """Each trainer keeps a prefix of its nodes, or keeps them all and grows by a few
    free ones: a map without migration."""
    held = {n for t in terms for n in t.current}
    free = [n for n in pool if n not in held]
    rng.shuffle(free)
    nodes = {}
    for t in terms:
        grow = rng.randint(0, 3) if t.c < t.n_max else 0
        if grow:
            nodes[t.id], free = t.current + tuple(free[:grow]), free[grow:]
        else:
            nodes[t.id] = t.current[: rng.randint(0, t.c)]
    return nodes


@pytest.mark.parametrize("seed", range(8))
def test_a_maps_value_from_its_mapping_is_pair_value(seed: int) -> None:
    """V of a map summed from the values its mapping computed (and each unmoved
    trainer's own, kept) is ``pair_value`` of its nodes, to the bit."""
    problem = queue_problem(seed)
    terms = build_terms(problem)
    raw = win.raw_windows(problem)
    ordered = sorted(problem.pool, key=lambda n: -raw[n])
    rng = random.Random(seed)
    kept: dict[str, tuple[float, float]] = {}
    for _ in range(30):
        counts = {t.id: rng.choice([0, t.c, max(t.c - 2, 0), t.c + 3]) for t in terms}
        counts = {k: min(v, 16) for k, v in counts.items()}
        nodes, _, _, valued = win._map_windows(terms, counts, ordered, raw, 120.0, True)
        got = win._pair_value(terms, valued, kept, raw, 120.0)
        assert got == wv.pair_value(terms, nodes, raw, 120.0)


@pytest.mark.parametrize("seed", range(6))
def test_has_windows_by_a_loop_is_any_over_the_windows(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(100):
        pool = tuple(f"n{i}" for i in range(rng.randint(1, 12)))
        windows = {n: rng.choice([None, 0.0, 30.0, 3599.0, 3600.0, 9e3]) for n in pool}
        problem = Problem(
            pool=pool,
            trainers=(),
            t_fwd_s=rng.choice([60.0, 5000.0]),
            windows_s=dict(rng.sample(sorted(windows.items()), rng.randint(0, len(pool)))),
        )
        t = wv.departure_horizon_s(problem.t_fwd_s)
        want = any(w is not None and w < t for w in problem.windows_s.values())
        assert win.has_windows(problem) is want


def roomy_problem(free_short: int, free_long: int) -> Problem:
    """Three trainers of n_max 8 holding two long-staying nodes each; free nodes that
    stay (no window) and free nodes that leave in 30 s."""
    held = [f"h{i}" for i in range(6)]
    long = [f"l{i:02d}" for i in range(free_long)]
    short = [f"s{i:02d}" for i in range(free_short)]
    curve = ((1.0, 100.0), (8.0, 700.0))
    trainers = tuple(
        TrainerSpec(f"t{k}", 1, 8, 18.0, 12.0, curve, tuple(held[2 * k : 2 * k + 2]))
        for k in range(3)
    )
    windows: dict[str, float | None] = {n: 30.0 for n in short}
    windows.update(dict.fromkeys(held + long))
    return Problem(tuple(held + short + long), trainers, t_fwd_s=120.0, windows_s=windows)


def test_a_map_worth_eq16s_optimum_is_taken_without_the_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Enough nodes stay past the horizon for the window-free optimum: its map is worth
    Eq. 16's optimum, which bounds every map, so neither the rounds nor the local search
    run; the long path finds that V too."""
    problem = roomy_problem(free_short=10, free_long=20)
    long_path = allocate(problem, solver="dp")

    def not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("searched a map already worth the bound")

    monkeypatch.setattr(win, "_rounds", not_run)
    monkeypatch.setattr(win, "improve_by_swaps", not_run)
    got = allocate(problem, solver="dp")
    assert got.status == "windows"
    assert got.bound is not None
    assert got.objective == pytest.approx(got.bound, rel=1e-12)
    assert got.objective == pytest.approx(long_path.objective, rel=1e-12)
    assert all(len(got.nodes[t.id]) == 8 for t in problem.trainers)
    assert not any(n.startswith("s") for ns in got.nodes.values() for n in ns)


def count_searches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each local search the allocator runs."""
    searched: list[int] = []
    search = win.improve_by_swaps

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        searched.append(1)
        return search(*args, **kwargs)

    monkeypatch.setattr(win, "improve_by_swaps", counted)
    return searched


def test_a_map_below_the_bound_is_still_searched(monkeypatch: pytest.MonkeyPatch) -> None:
    """Too few nodes stay: some trainer must take leaving nodes, V is below Eq. 16's
    optimum, and the rounds and the search run as before."""
    problem = roomy_problem(free_short=10, free_long=6)
    searched = count_searches(monkeypatch)
    got = allocate(problem, solver="dp")
    assert searched
    assert got.bound is not None and got.objective < got.bound


def spare_problem(seed: int) -> Problem:
    """A few trainers on a pool larger than they can use, a tenth of its nodes leaving
    within the horizon: some seeds reach Eq. 16's optimum, some do not."""
    rng = random.Random(seed)
    pool = tuple(f"n{i:02d}" for i in range(rng.randint(60, 90)))
    free = list(pool)
    rng.shuffle(free)
    curve = ((1.0, 100.0), (8.0, 700.0), (16.0, 1200.0))
    trainers = []
    for k in range(rng.randint(3, 5)):
        held = rng.randint(0, 8)
        nodes, free = tuple(sorted(free[:held])), free[held:]
        trainers.append(TrainerSpec(f"t{k}", rng.choice([1, 2]), 16, 18.0, 12.0, curve, nodes))
    leaving = [30.0, 90.0, 400.0]
    windows = {
        n: rng.choice(leaving) if rng.random() < 0.1 else rng.choice([None, 5000.0]) for n in pool
    }
    return Problem(pool, tuple(trainers), t_fwd_s=120.0, windows_s=windows)


def at_the_bound_against_the_long_path(problem: Problem, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Solve ``problem`` with and without the bound rule: never a lower V; at the bound
    the long path's V, below it the same path to the bit. True if it was at the bound."""
    short = allocate(problem, solver="dp")
    with monkeypatch.context() as m:
        m.setattr(win, "_AT_THE_BOUND", False)
        long = allocate(problem, solver="dp")
    tol = 1e-9 * max(1.0, abs(long.objective))
    assert short.objective >= long.objective - tol
    if short.objective >= short.bound - tol:  # type: ignore[operator]
        assert long.objective == pytest.approx(short.objective, rel=1e-9)
        return True
    # not at the bound: the same path, to the bit
    assert dict(short.nodes) == dict(long.nodes)
    assert short.objective == long.objective
    return False


@pytest.mark.parametrize("seed", range(12))
def test_taking_a_map_at_the_bound_never_loses_v(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_the_bound_against_the_long_path(queue_problem(seed), monkeypatch)


def test_spare_pools_at_and_below_the_bound_against_the_long_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The queues above never reach the bound (their pools are too tight): on spare
    pools both branches are taken."""
    reached = [at_the_bound_against_the_long_path(spare_problem(s), monkeypatch) for s in range(24)]
    assert any(reached) and not all(reached)


def test_a_falling_curve_is_searched_even_at_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a value that falls past some count, a node leaving raises it: V may pass
    Eq. 16's optimum, which then bounds nothing, so the search runs."""
    problem = roomy_problem(free_short=10, free_long=20)
    falling = ((1.0, 100.0), (4.0, 400.0), (8.0, 300.0))
    trainers = tuple(
        TrainerSpec(t.id, t.n_min, t.n_max, 18.0, 12.0, falling if k == 0 else t.curve, t.nodes)
        for k, t in enumerate(problem.trainers)
    )
    problem = Problem(problem.pool, trainers, t_fwd_s=120.0, windows_s=problem.windows_s)
    searched = count_searches(monkeypatch)
    got = allocate(problem, solver="dp")
    assert got.status == "windows"
    assert searched
