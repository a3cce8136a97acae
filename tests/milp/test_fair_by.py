"""Fairness by user or account: many trainers of one user do not crowd out another's one.

Exactness against the exhaustive oracle (which has its own implementation of the
group-level objective) is in test_allocate.py: its random problems draw owners,
``fair_by`` and weights.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings

from bftrainer.milp import Problem, ProblemError, TrainerSpec, allocate, problem_from_dict
from bftrainer.milp.problem import fair_admission
from tests.milp.strategies import problems

LINEAR = ((1.0, 100.0), (80.0, 8000.0))


def _trainer(tid: str, user: str, **kw: object) -> TrainerSpec:
    args: dict[str, object] = dict(
        n_min=1, n_max=80, rescale_up_s=20.0, rescale_down_s=10.0, curve=LINEAR
    )
    args.update(kw)
    return TrainerSpec(id=tid, user=user, account=f"acct-{user}", **args)  # type: ignore[arg-type]


def _twenty_and_one(pool_size: int, fair_by: str, p: float, **kw: object) -> Problem:
    """User "many" submitted 20 identical trainers, then user "one" submitted one."""
    trainers = tuple(_trainer(f"many{i:02d}", "many") for i in range(20))
    return Problem(
        pool=tuple(f"n{i}" for i in range(pool_size)),
        trainers=(*trainers, _trainer("one", "one")),
        fairness_p=p,
        fair_by=fair_by,
        max_trainers=21,
        **kw,  # type: ignore[arg-type]
    )


def _totals(counts: dict[str, int]) -> tuple[int, int]:
    return sum(n for k, n in counts.items() if k.startswith("many")), counts["one"]


@pytest.mark.parametrize("p", [0.0, -1.0])
@pytest.mark.parametrize("pool_size", [40, 80])
@pytest.mark.parametrize("solver", ["dp", "highs"])
def test_a_user_with_twenty_trainers_does_not_crowd_out_a_user_with_one(
    p: float, pool_size: int, solver: str
) -> None:
    by_trainer = allocate(_twenty_and_one(pool_size, "trainer", p), solver=solver)
    many, one = _totals(dict(by_trainer.counts))
    assert many + one == pool_size
    assert one <= pool_size // 20  # one trainer among 21: about a 21st of the pool
    for fair_by in ("user", "account"):
        result = allocate(_twenty_and_one(pool_size, fair_by, p), solver=solver)
        assert result.status == "optimal"
        # Identical linear curves: each user's total is half the pool.
        assert _totals(dict(result.counts)) == (pool_size // 2, pool_size // 2)


def test_the_node_model_agrees_on_the_fair_split() -> None:
    problem = _twenty_and_one(40, "user", -1.0)
    node = allocate(problem, formulation="node", solver="highs")
    assert node.status == "optimal"
    assert node.objective == pytest.approx(allocate(problem, solver="dp").objective, rel=1e-9)
    assert _totals(dict(node.counts)) == (20, 20)


def test_a_weight_gives_a_user_a_larger_share() -> None:
    even = allocate(_twenty_and_one(80, "user", -1.0), solver="dp")
    weighted = allocate(_twenty_and_one(80, "user", -1.0, fair_weights={"one": 2.0}), solver="dp")
    assert _totals(dict(even.counts)) == (40, 40)
    many, one = _totals(dict(weighted.counts))
    # Twice the weight, about twice the nodes (integral counts and the even split among
    # "many"'s own trainers keep it from exactly 2).
    assert many + one == 80 and 1.8 <= one / many <= 2.6


def test_with_fair_share_speedup_the_share_is_the_users() -> None:
    result = allocate(_twenty_and_one(40, "user", -1.0, fair_share_speedup=True), solver="dp")
    assert _totals(dict(result.counts)) == (20, 20)


def test_admission_takes_turns_across_users() -> None:
    trainers = tuple(_trainer(f"many{i:02d}", "many") for i in range(20))
    problem = Problem(
        pool=tuple(f"n{i}" for i in range(20)),
        trainers=(*trainers, _trainer("one", "one")),
        max_trainers=10,
        fairness_p=-1.0,
    )
    first_come = allocate(problem, solver="dp")
    assert "one" in first_come.waiting and first_come.counts["one"] == 0
    fair = allocate(replace(problem, fair_by="user"), solver="dp")
    # Half the pool, within what 9 admitted trainers of "many" can split evenly.
    assert "one" not in fair.waiting and 9 <= fair.counts["one"] <= 11
    assert len(fair.waiting) == 11  # the last eleven of "many"'s, in arrival order
    assert fair.waiting == tuple(f"many{i:02d}" for i in range(9, 20))


def test_fair_admission_rounds() -> None:
    assert fair_admission(["a", "a", "a", "b", "c", "b"], 4) == [0, 1, 3, 4]
    assert fair_admission(["a", "b", "c"], 2) == [0, 1]  # one per group: first come
    assert fair_admission([], 3) == []


@settings(max_examples=60, deadline=None)
@given(problems())
def test_by_trainer_owners_change_nothing(problem: Problem) -> None:
    """The default: today's answer to the last digit, whoever owns the trainers."""
    labelled = replace(problem, fair_by="trainer", fair_weights={})
    anonymous = replace(
        labelled,
        trainers=tuple(replace(t, user="", account="") for t in labelled.trainers),
        fair_weights={},
    )
    a, b = allocate(labelled, solver="dp"), allocate(anonymous, solver="dp")
    assert a.nodes == b.nodes and a.objective == b.objective and a.waiting == b.waiting


@settings(max_examples=60, deadline=None)
@given(problems())
def test_at_p_one_without_fair_share_grouping_is_the_plain_sum(problem: Problem) -> None:
    plain = replace(
        problem, fair_by="trainer", fair_weights={}, fairness_p=1.0, fair_share_speedup=False
    )
    one_group = replace(
        plain,
        fair_by="user",
        trainers=tuple(replace(t, user="") for t in plain.trainers),
    )
    a, b = allocate(plain, solver="dp"), allocate(one_group, solver="dp")
    assert a.nodes == b.nodes and a.objective == b.objective


def test_from_json_and_bad_input_in_one_line() -> None:
    doc = {
        "pool": ["a", "b"],
        "fair_by": "account",
        "fair_weights": {"physics": 2},
        "trainers": [
            {
                "id": "t1",
                "n_min": 1,
                "n_max": 2,
                "rescale_up": 0,
                "rescale_down": 0,
                "curve": [[2, 2]],
                "user": "ann",
                "account": "physics",
            }
        ],
    }
    problem = problem_from_dict(doc)
    assert problem.fair_by == "account" and problem.group_of(problem.trainers[0]) == "physics"
    assert problem.weight_of("physics") == 2 and problem.weight_of("other") == 1
    with pytest.raises(ProblemError, match="fair_by 'group' is not one of trainer, user"):
        problem_from_dict({**doc, "fair_by": "group"})
    with pytest.raises(ProblemError, match=r"fair_weights: 'physics' is 0, expected >= 0.001"):
        problem_from_dict({**doc, "fair_weights": {"physics": 0}})
    with pytest.raises(ProblemError, match="fair_weights: 'x' is 'heavy', expected a number"):
        problem_from_dict({**doc, "fair_weights": {"x": "heavy"}})
    # Weights are per user or account: by trainer they were ignored (issue 42's class).
    with pytest.raises(ProblemError, match='fair_weights means nothing without fair_by "user"'):
        problem_from_dict({**doc, "fair_by": "trainer"})
    assert problem_from_dict({**doc, "fair_by": "trainer", "fair_weights": {}}).fair_by == "trainer"
    bad_user = {**doc["trainers"][0], "user": 7}  # type: ignore[index]
    with pytest.raises(ProblemError, match=r"trainers\[0\].*user is 7, expected a name"):
        problem_from_dict({**doc, "trainers": [bad_user]})
