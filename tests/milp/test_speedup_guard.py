"""The speedup objective and fair-share speedup divide each curve by one of its rates:
a rate so small that the table would pass the curve limit (or overflow) is refused in
one line naming the trainer, never a NaN table, an infinite one or a starved trainer;
``slots_per_node`` has the limit of everywhere else (docs/allocator.md, "Limits")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bftrainer.common.names import MAX_SLOTS
from bftrainer.milp import Problem, ProblemError, TrainerSpec, allocate
from bftrainer.milp.dp import solve_counts
from bftrainer.milp.objective import build_terms
from bftrainer.milp.problem import CURVE_VALUE_MAX

POOL = ("a", "b", "c", "d")
SOLVERS = ["dp", "highs"]


def trainer(tid: str, curve: tuple[tuple[float, float], ...], n_max: int = 4) -> TrainerSpec:
    return TrainerSpec(tid, 1, n_max, 1.0, 1.0, curve)


def linear(tid: str = "t2") -> TrainerSpec:
    return trainer(tid, ((1.0, 1.0), (4.0, 4.0)))


@pytest.mark.parametrize("one", [1e-300, 1e-320, 5e-324, 1e-3])
def test_a_rate_at_1_node_too_small_to_divide_by_is_refused(one: float) -> None:
    # 1e-300 overflowed to inf (the DP's table got NaN; HiGHS gave t1 nothing, "optimal");
    # 5e-324 made the objective null. 1e-3 stays finite but its speedups pass 1e12.
    t1 = trainer("t1", ((1.0, one), (4.0, 1e12)))
    with pytest.raises(ProblemError) as e:
        Problem(pool=POOL, trainers=(t1, linear()), objective="speedup")
    message = str(e.value)
    assert "\n" not in message
    assert "trainer 't1'" in message and "rate at 1 node" in message and repr(one) in message
    from bftrainer.milp import check_speedup  # what a workload runs up front

    with pytest.raises(ProblemError):
        check_speedup(t1)


@pytest.mark.parametrize("solver", SOLVERS)
def test_at_the_limit_the_table_is_finite_and_the_fast_scaler_is_not_starved(
    solver: str,
) -> None:
    # One rate at 1 node exactly 1e12 times below the curve's top is accepted; one a
    # hair below that is refused. The accepted one gets the pool (its speedup is 1e12).
    one = 1e12 / CURVE_VALUE_MAX
    t1 = trainer("t1", ((1.0, one), (4.0, 1e12)))
    problem = Problem(pool=POOL, trainers=(t1, linear()), objective="speedup")
    result = allocate(problem, solver=solver)
    assert result.status == "optimal"
    assert math.isfinite(result.objective)
    assert result.counts["t1"] == 4
    with pytest.raises(ProblemError, match="trainer 't1'"):
        Problem(
            pool=POOL,
            trainers=(trainer("t1", ((1.0, math.nextafter(one, 0.0)), (4.0, 1e12))), linear()),
            objective="speedup",
        )


@pytest.mark.parametrize("solver", SOLVERS)
def test_allocate_refuses_the_reported_problem_with_either_solver(solver: str) -> None:
    # Before: the DP raised InfeasibleCountsError after a NaN table; HiGHS said "optimal"
    # with t1 (1e12 at 4 nodes) at 0 nodes. Now no solver is reached.
    with pytest.raises(ProblemError, match="trainer 't1'"):
        allocate(
            Problem(
                pool=POOL,
                trainers=(trainer("t1", ((1.0, 1e-300), (4.0, 1e12))), linear()),
                objective="speedup",
            ),
            solver=solver,
        )


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(
    ("objective", "slots", "one"),
    [("throughput", 1, 1e-310), ("speedup", 1, 1.0), ("throughput", 2, 1e-310)],
)
def test_a_rate_at_the_fair_share_too_small_to_divide_by_is_refused(
    objective: str, slots: int, one: float, solver: str
) -> None:
    # Two trainers on 4 nodes (8 slots): t1's fair share is 2 (4 slots), where its rate
    # is 1e-310; dividing by it overflowed.
    at = 2 * slots
    curve = ((1.0, one), (float(at), 1e-310), (4.0 * slots, 1e12))
    t1 = TrainerSpec("t1", 1, 4 * slots, 1.0, 1.0, curve)
    t2 = TrainerSpec("t2", 1, 4 * slots, 1.0, 1.0, ((1.0, 1.0), (4.0 * slots, 4.0 * slots)))
    problem = Problem(
        pool=POOL,
        trainers=(t1, t2),
        objective=objective,
        fair_share_speedup=True,
        slots_per_node=slots,
    )
    with pytest.raises(ProblemError) as e:
        allocate(problem, solver=solver)
    message = str(e.value)
    assert "\n" not in message and "trainer 't1'" in message
    assert f"fair share of {at}" in message


@pytest.mark.parametrize("one", [1e-300, 5e-324])
def test_slots_divide_by_the_same_rule(one: float) -> None:
    t1 = TrainerSpec("t1", 1, 8, 1.0, 1.0, ((1.0, one), (8.0, 1e12)))
    with pytest.raises(ProblemError, match=r"trainer 't1'.*rate at 1 node"):
        Problem(pool=POOL, trainers=(t1,), objective="speedup", slots_per_node=2)


def test_slots_per_node_has_the_limit_of_everywhere_else() -> None:
    t1 = trainer("t1", ((1.0, 10.0), (4.0, 40.0)))
    Problem(pool=POOL, trainers=(t1,), slots_per_node=MAX_SLOTS)
    for slots in (MAX_SLOTS + 1, 10**9, 10**20):
        with pytest.raises(ProblemError, match=f"slots_per_node is {slots}, expected 1 to 1024"):
            Problem(pool=POOL, trainers=(t1,), slots_per_node=slots)


def test_the_dp_refuses_a_table_with_nan_or_plus_inf() -> None:
    problem = Problem(pool=POOL, trainers=(linear("t1"), linear()))
    terms = build_terms(problem)
    for bad in (math.nan, math.inf):
        tables = [t.scores(problem.t_fwd_s).copy() for t in terms]
        tables[0][2] = bad
        with pytest.raises(ProblemError, match=r"trainer 't1'.*NaN or \+inf"):
            solve_counts(terms, len(POOL), problem.t_fwd_s, tables=tables)
    # -inf is what a count below n_min is worth: still accepted
    tables = [t.scores(problem.t_fwd_s).copy() for t in terms]
    tables[0][1] = -np.inf
    counts, value = solve_counts(terms, len(POOL), problem.t_fwd_s, tables=tables)
    assert math.isfinite(value) and sum(counts.values()) <= len(POOL)
