"""The default solver's path: the exact DP's answer prunes the count model by its LP bound
and starts HiGHS (milp/bound.py, issue 11 "the default solver on any instance").

The pruning must never remove an optimal answer, and the path must reach the exhaustive
optimum with a verified ``optimal``; checked here on small random instances."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from bftrainer.milp import Problem, TrainerSpec, allocate
from bftrainer.milp import bound as bound_module
from bftrainer.milp.allocate import current_counts
from bftrainer.milp.bound import bounds_by_count, counts_that_can_win, lagrangian_bound
from bftrainer.milp.check import violations
from bftrainer.milp.count import build_count_model
from bftrainer.milp.dp import solve_counts
from bftrainer.milp.model import Milp
from bftrainer.milp.objective import TrainerTerms, build_terms, objective_of_counts
from bftrainer.milp.solvers import MILP_SOLVERS, SolveOutcome, SolveStatus
from bftrainer.milp.solvers.highs import HighsSolver
from tests.milp.strategies import problems


def close(a: float, b: float, rel: float = 1e-6) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def every_count_vector(
    terms: list[TrainerTerms], pool: int, t_fwd: float
) -> Iterator[tuple[float, tuple[int, ...]]]:
    """(value, counts) of every allowed count vector within the pool: the exhaustive set."""
    choices = [np.flatnonzero(np.isfinite(t.scores(t_fwd))) for t in terms]
    for combo in itertools.product(*choices):
        if sum(combo) <= pool:
            value = sum(float(t.scores(t_fwd)[n]) for t, n in zip(terms, combo, strict=True))
            yield value, combo


def lp_relaxation(terms: list[TrainerTerms], pool: int, t_fwd: float) -> float:
    """The per-count model's LP optimum, by scipy's LP solver: an independent check."""
    options = [np.flatnonzero(np.isfinite(t.scores(t_fwd))) for t in terms]
    c = -np.concatenate([t.scores(t_fwd)[o] for t, o in zip(terms, options, strict=True)])
    owner = np.repeat(np.arange(len(terms)), [len(o) for o in options])
    a_eq = (owner[None, :] == np.arange(len(terms))[:, None]).astype(float)
    a_ub = np.concatenate(options).astype(float)[None, :]
    found = linprog(c, A_ub=a_ub, b_ub=[pool], A_eq=a_eq, b_eq=np.ones(len(terms)), bounds=(0, 1))
    assert found.status == 0
    return -float(found.fun)


@settings(max_examples=80, deadline=None)
@given(problems(max_pool=8, max_trainers=4))
def test_the_lagrangian_bound_is_the_lp_optimum_and_bounds_the_exact_one(
    problem: Problem,
) -> None:
    terms = build_terms(problem)
    if not terms:
        return
    t_fwd = float(problem.t_fwd_s)
    pool = len(problem.pool)
    bound, lam = lagrangian_bound([t.scores(t_fwd) for t in terms], pool)
    exact = solve_counts(terms, pool, t_fwd)[1]
    assert lam >= 0
    assert bound >= exact - 1e-9 * max(1.0, abs(exact))
    assert close(bound, lp_relaxation(terms, pool, t_fwd))


@pytest.mark.parametrize("by", ["count", "lagrangian"])
@settings(max_examples=80, deadline=None)
@given(problem=problems(max_pool=8, max_trainers=4), data=st.data())
def test_pruning_keeps_every_optimal_answer_for_any_feasible_floor(
    by: str, problem: Problem, data: st.DataObject
) -> None:
    # "lagrangian": the reduced-cost rule that large problems use instead.
    max_work = bound_module.PER_COUNT_MAX_WORK if by == "count" else 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bound_module, "PER_COUNT_MAX_WORK", max_work)
        check_pruning(problem, data)


def check_pruning(problem: Problem, data: st.DataObject) -> None:
    terms = build_terms(problem)
    if not terms:
        return
    t_fwd = float(problem.t_fwd_s)
    pool = len(problem.pool)
    answers = list(every_count_vector(terms, pool, t_fwd))
    best = max(v for v, _ in answers)
    optimal = [combo for v, combo in answers if v >= best - 1e-9 * max(1.0, abs(best))]
    # The floor: the optimum itself (the DP's answer) or any feasible answer below it.
    floor = data.draw(st.sampled_from([best] + [v for v, _ in answers]))
    kept = counts_that_can_win([t.scores(t_fwd) for t in terms], pool, floor)
    for combo in optimal:
        for n, allowed in zip(combo, kept, strict=True):
            assert n in allowed


@settings(max_examples=60, deadline=None)
@given(problems(max_pool=8, max_trainers=4))
def test_each_counts_bound_is_the_lp_optimum_with_that_count_fixed(problem: Problem) -> None:
    terms = build_terms(problem)
    if not terms:
        return
    t_fwd = float(problem.t_fwd_s)
    pool = len(problem.pool)
    bounds = bounds_by_count([t.scores(t_fwd) for t in terms], pool)
    for j, t in enumerate(terms):
        for n, s in enumerate(t.scores(t_fwd)):
            if not np.isfinite(s) or n > pool:
                assert bounds[j][n] == -np.inf
                continue
            others = terms[:j] + terms[j + 1 :]
            expected = float(s) + (lp_relaxation(others, pool - n, t_fwd) if others else 0.0)
            assert close(bounds[j][n], expected)


@settings(max_examples=60, deadline=None)
@given(problems(max_pool=8, max_trainers=4))
def test_the_default_solver_reaches_the_exhaustive_optimum_verified(problem: Problem) -> None:
    result = allocate(problem)  # the default solver, as `bftrainer allocate` runs it
    assert result.status == "optimal"
    assert violations(problem, result.nodes) == []
    # The exact solve: every count vector of the model (the DP's exactness against node
    # maps is test_allocate's), and the DP.
    terms = build_terms(problem)
    t_fwd = float(problem.t_fwd_s)
    exhaustive = max(
        (v for v, _ in every_count_vector(terms, len(problem.pool), t_fwd)), default=0.0
    )
    assert close(result.objective, exhaustive)
    assert close(result.objective, allocate(problem, solver="dp").objective)


@settings(max_examples=60, deadline=None)
@given(problems(max_pool=8, max_trainers=4))
def test_highs_on_a_model_pruned_by_a_worse_answer_still_finds_the_optimum(
    problem: Problem,
) -> None:
    # The current map (made feasible) as incumbent: usually not optimal, so the model
    # keeps more counts, and HiGHS must find the better answer in what is left.
    terms = build_terms(problem)
    if not terms:
        return
    t_fwd = float(problem.t_fwd_s)
    pool = len(problem.pool)
    incumbent = current_counts(terms)
    model = build_count_model(terms, pool, t_fwd, "per_count", incumbent)
    assert model.milp.start is not None
    assert close(
        float(model.milp.c @ model.milp.start), objective_of_counts(terms, incumbent, t_fwd)
    )
    found = HighsSolver().solve(model.milp, time_limit_s=10.0)
    assert found.status is SolveStatus.OPTIMAL and found.x is not None
    counts = model.counts(found.x, terms)
    assert sum(counts.values()) <= pool
    assert close(objective_of_counts(terms, counts, t_fwd), solve_counts(terms, pool, t_fwd)[1])


def test_an_infeasible_incumbent_neither_prunes_nor_starts() -> None:
    curve = ((1.0, 100.0), (2.0, 190.0), (4.0, 360.0))
    problem = Problem(
        pool=tuple(f"n{i}" for i in range(5)),
        trainers=tuple(TrainerSpec(f"t{j}", 1, 4, 20.0, 10.0, curve) for j in range(3)),
    )
    terms = build_terms(problem)
    full = build_count_model(terms, 5, 120.0, "per_count")
    for wrong in ({"t0": 4, "t1": 4}, {"t0": 5}, {"t0": -1}):  # over the pool, over n_max
        model = build_count_model(terms, 5, 120.0, "per_count", wrong)
        assert model.milp.start is None
        assert model.milp.num_vars == full.milp.num_vars


def test_a_random_30_by_800_event_leaves_a_small_model() -> None:
    # The benchmark's random instance (benchmarks/allocator.py): the bound keeps a few
    # per cent of the binaries, which is what makes HiGHS' proof quick.
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "allocator_bench", Path(__file__).resolve().parents[2] / "benchmarks" / "allocator.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    problem = bench.random_instance(30, 800, seed=0)
    terms = build_terms(problem)
    t_fwd = float(problem.t_fwd_s)
    counts, _ = solve_counts(terms, len(problem.pool), t_fwd)
    full = build_count_model(terms, len(problem.pool), t_fwd, "per_count")
    pruned = build_count_model(terms, len(problem.pool), t_fwd, "per_count", counts)
    assert pruned.milp.num_vars < 0.1 * full.milp.num_vars
    result = allocate(problem)
    assert result.status == "optimal"
    assert close(result.objective, objective_of_counts(terms, counts, t_fwd), rel=1e-9)


class ZeroLiar:
    """Says "optimal" for an answer that gives every trainer nothing, whatever start it
    is given (the hardening tests' liar runs HiGHS, which now returns the DP's start)."""

    name = "zero-liar"
    native_sos2 = False

    def solve(self, milp: Milp, *, time_limit_s: float, mip_gap: float = 1e-7) -> SolveOutcome:
        return SolveOutcome(SolveStatus.OPTIMAL, np.zeros(milp.num_vars), 0.0, 0.0, 0.0)


def test_a_false_optimal_on_the_pruned_model_is_replaced_by_the_exact_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    curve = ((1.0, 100.0), (2.0, 190.0), (4.0, 360.0))
    problem = Problem(
        pool=tuple(f"n{i}" for i in range(6)),
        trainers=tuple(TrainerSpec(f"t{j}", 1, 4, 20.0, 10.0, curve) for j in range(3)),
    )
    monkeypatch.setitem(MILP_SOLVERS, "highs", ZeroLiar)
    result = allocate(problem, solver="highs")
    assert result.status == "optimal"
    assert result.objective > 0
    assert close(result.objective, allocate(problem, solver="dp").objective)
