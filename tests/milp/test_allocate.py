"""The allocator against an exhaustive oracle, across formulations and solvers."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import HealthCheck, given, settings

from bftrainer.milp import Problem, ProblemError, TrainerSpec, allocate
from bftrainer.milp.check import violations
from bftrainer.milp.count import build_count_model
from bftrainer.milp.objective import build_terms, objective_of_counts
from bftrainer.milp.solvers.highs import HighsSolver
from tests.milp.oracle import brute_force, eq16
from tests.milp.strategies import problems

HAS_GUROBI = importlib.util.find_spec("gurobipy") is not None
COMBOS = [("count", "dp"), ("count", "highs"), ("node", "highs"), ("count", "cbc"), ("node", "cbc")]
if HAS_GUROBI:
    COMBOS += [("count", "gurobi"), ("node", "gurobi")]

TOL = 1e-6


def objective_scale(problem: Problem) -> float:
    """The largest |coefficient| of Eq. 16 over the admitted trainers' options."""
    scores = [abs(s) for t in build_terms(problem) for s in t.scores(problem.t_fwd_s)]
    return max([1.0, *(s for s in scores if s != float("inf"))])


def close(a: float, b: float) -> bool:
    return abs(a - b) <= TOL * max(1.0, abs(a), abs(b))


@settings(max_examples=150, deadline=None)
@given(problems(max_pool=6, max_trainers=3))
def test_dp_matches_exhaustive_search_over_node_maps(problem: Problem) -> None:
    # Also proves the count model exact: the oracle searches node maps, not counts.
    result = allocate(problem, solver="dp")
    assert violations(problem, result.nodes) == []
    assert close(result.objective, brute_force(problem))
    assert close(result.objective, eq16(problem, dict(result.counts)))


@pytest.mark.parametrize(("formulation", "solver"), COMBOS)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(problem=problems())
def test_every_solver_reaches_the_same_optimum(
    formulation: str, solver: str, problem: Problem
) -> None:
    expected = allocate(problem, solver="dp").objective
    result = allocate(problem, formulation=formulation, solver=solver)
    assert result.status == "optimal"
    assert violations(problem, result.nodes) == []
    # MILP solvers are exact up to their tolerances, relative to the objective's scale.
    assert abs(result.objective - expected) <= 1e-6 * objective_scale(problem)
    if result.bound is not None:
        assert result.bound >= result.objective - 1e-6 * max(1.0, abs(result.objective))


def _trainer(tid: str, nodes: tuple[str, ...] = (), **kw: object) -> TrainerSpec:
    args: dict[str, object] = dict(
        n_min=1,
        n_max=4,
        rescale_up_s=20.0,
        rescale_down_s=10.0,
        curve=((1.0, 100.0), (2.0, 190.0), (4.0, 360.0)),
        nodes=nodes,
    )
    args.update(kw)
    return TrainerSpec(id=tid, **args)  # type: ignore[arg-type]


def test_departed_nodes_are_dropped_and_never_allocated() -> None:
    p = Problem(pool=("a", "b", "c"), trainers=(_trainer("t", ("a", "x", "y")),))
    result = allocate(p)
    assert set(result.nodes["t"]) <= {"a", "b", "c"}
    assert "a" in result.nodes["t"]  # no migration: grows from its surviving node


def test_admission_is_first_come_first_served() -> None:
    p = Problem(
        pool=tuple(f"n{i}" for i in range(12)),
        trainers=tuple(_trainer(f"t{i}") for i in range(3)),
        max_trainers=2,
    )
    result = allocate(p)
    assert result.waiting == ("t2",)
    assert result.nodes["t2"] == ()
    assert result.counts["t0"] == result.counts["t1"] == 4


def test_rescale_cost_keeps_a_running_trainer_when_growth_does_not_pay() -> None:
    # Growing from 2 to 4 nodes adds 170/s for T_fwd = 1 s but costs 190 * 20 s.
    p = Problem(pool=("a", "b", "c", "d"), trainers=(_trainer("t", ("a", "b")),), t_fwd_s=1.0)
    assert allocate(p).counts["t"] == 2
    p = Problem(pool=("a", "b", "c", "d"), trainers=(_trainer("t", ("a", "b")),), t_fwd_s=1000.0)
    assert allocate(p).counts["t"] == 4


def test_a_trainer_below_n_min_after_departures_is_stopped_or_regrown() -> None:
    t = _trainer("t", ("a", "b", "c"), n_min=3)
    stopped = allocate(Problem(pool=("a", "b"), trainers=(t,)))
    assert stopped.counts["t"] == 0
    regrown = allocate(Problem(pool=("a", "b", "z"), trainers=(t,)))
    assert regrown.nodes["t"] == ("a", "b", "z")


def test_speedup_weighs_slow_and_fast_models_alike() -> None:
    fast = _trainer("fast", n_max=8, curve=((1.0, 1000.0), (8.0, 8000.0)))
    slow = _trainer("slow", n_max=8, curve=((1.0, 10.0), (8.0, 80.0)))
    pool = tuple(f"n{i}" for i in range(8))
    by_rate = allocate(Problem(pool=pool, trainers=(fast, slow), objective="throughput"))
    assert by_rate.counts == {"fast": 8, "slow": 0}
    # Linear curves: every split is optimal by speedup; a concave slow curve breaks the tie.
    slow = _trainer("slow", n_max=8, curve=((1.0, 10.0), (2.0, 19.0), (8.0, 60.0)))
    fast = _trainer("fast", n_max=8, curve=((1.0, 1000.0), (2.0, 1100.0), (8.0, 1500.0)))
    by_speedup = allocate(Problem(pool=pool, trainers=(fast, slow), objective="speedup"))
    assert by_speedup.counts["slow"] > by_speedup.counts["fast"]


def test_time_limit_keeps_the_better_of_incumbent_and_current_map() -> None:
    pool = tuple(f"n{i}" for i in range(400))
    trainers = tuple(
        _trainer(
            f"t{j}",
            tuple(pool[j * 10 : j * 10 + 5]),
            n_max=64,
            curve=((1.0, 100.0), (8.0, 700.0), (16.0, 1500.0), (64.0, 4000.0)),
        )
        for j in range(20)
    )
    p = Problem(pool=pool, trainers=trainers, max_trainers=20)
    current = eq16(p, {t.id: len(t.nodes) for t in trainers})
    result = allocate(p, formulation="node", solver="highs", time_limit_s=0.05)
    assert result.status in {"time_limit", "kept_current"}
    assert violations(p, result.nodes) == []
    assert result.objective >= current - 1e-6 * abs(current)
    if result.status == "kept_current":
        assert dict(result.counts) == {t.id: 5 for t in trainers}


def test_terms_cap_n_max_at_the_pool_size() -> None:
    p = Problem(pool=("a", "b"), trainers=(_trainer("t", n_min=3),))
    (terms,) = build_terms(p)
    assert not terms.runnable
    assert allocate(p).counts["t"] == 0


@pytest.mark.parametrize("encoding", ["sos2", "per_count"])
@settings(max_examples=40, deadline=None)
@given(problem=problems())
def test_both_count_encodings_reach_the_dp_optimum(encoding: str, problem: Problem) -> None:
    # The sos2 encoding goes through sos2_as_segments here: both are checked.
    terms = build_terms(problem)
    if not terms:
        return
    model = build_count_model(terms, len(problem.pool), problem.t_fwd_s, encoding)
    outcome = HighsSolver().solve(model.milp, time_limit_s=10)
    assert outcome.x is not None and outcome.objective is not None
    counts = model.counts(outcome.x, terms)
    expected = allocate(problem, solver="dp").objective
    tol = 1e-6 * objective_scale(problem)
    assert abs(outcome.objective - expected) <= tol
    assert abs(objective_of_counts(terms, counts, problem.t_fwd_s) - expected) <= tol
    assert sum(counts.values()) <= len(problem.pool)


def test_fairness_p_trades_total_for_equality() -> None:
    # Two fast trainers and one slow: by plain throughput the slow one waits.
    fast = ((1.0, 1000.0), (8.0, 8000.0))
    slow = ((1.0, 100.0), (8.0, 800.0))
    trainers = (
        _trainer("fast1", n_max=8, curve=fast),
        _trainer("fast2", n_max=8, curve=fast),
        _trainer("slow", n_max=8, curve=slow),
    )
    pool = tuple(f"n{i}" for i in range(12))
    counts = {}
    for p in (1.0, -1.0):
        problem = Problem(
            pool=pool, trainers=trainers, objective="goodput", fairness_p=p, fair_share_speedup=True
        )
        counts[p] = allocate(problem, solver="dp").counts
        assert allocate(problem, solver="highs").objective == pytest.approx(
            allocate(problem, solver="dp").objective, rel=1e-6
        )
    # fair-share speedup alone makes them comparable; p = -1 then equalises
    assert counts[-1.0] == {"fast1": 4, "fast2": 4, "slow": 4}
    by_rate = allocate(Problem(pool=pool, trainers=trainers, objective="throughput")).counts
    assert by_rate["slow"] == 0


def test_fairness_p_out_of_range_is_refused() -> None:
    with pytest.raises(ProblemError, match="fairness_p is 2"):
        Problem(pool=("a",), trainers=(), fairness_p=2.0)
