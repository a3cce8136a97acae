"""Promise (issue 40): ``TrainerSpec.weight`` w_j weighs a trainer's objective term,
w_j O_j, so a search's promising trials get more nodes; 1 is the paper's model."""

from __future__ import annotations

import pytest

from bftrainer.milp import Problem, ProblemError, TrainerSpec, allocate

# Diminishing returns: the marginal node is worth less the more a trainer holds.
CONCAVE = ((1.0, 100.0), (4.0, 300.0), (8.0, 450.0), (16.0, 560.0))


def _problem(weight_b: float | None) -> Problem:
    extra = {} if weight_b is None else {"weight": weight_b}
    trainers = (
        TrainerSpec("a", 1, 16, 10.0, 10.0, CONCAVE),
        TrainerSpec("b", 1, 16, 10.0, 10.0, CONCAVE, **extra),  # type: ignore[arg-type]
    )
    return Problem(pool=tuple(f"n{i}" for i in range(16)), trainers=trainers, max_trainers=2)


@pytest.mark.parametrize("solver", ["dp", "highs"])
def test_a_weighted_trainer_gets_more_nodes_and_weight_one_changes_nothing(solver: str) -> None:
    plain = allocate(_problem(None), solver=solver)
    assert plain.counts == allocate(_problem(1.0), solver=solver).counts
    assert plain.counts == {"a": 8, "b": 8}  # identical trainers: an even split
    promising = allocate(_problem(3.0), solver=solver).counts
    assert promising["b"] > promising["a"] and sum(promising.values()) == 16


@pytest.mark.parametrize("weight", [0.0, -1.0, float("nan"), 1e7, True])
def test_a_weight_that_is_not_a_positive_number_is_refused(weight: float) -> None:
    with pytest.raises(ProblemError, match="trainer 'b': weight is"):
        _problem(weight)
