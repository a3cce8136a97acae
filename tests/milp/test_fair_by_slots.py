"""Fairness by user or account with slots (S > 1): shares count slots, |pool| x S, so a
user with many trainers does not crowd out a user with one on shared nodes either.

Exactness against an exhaustive search over slot maps, fair by user with weights, is in
test_slots.py (``test_fair_by_user_with_slots_lies_within_the_bound_of_the_exact_optimum``).
"""

from __future__ import annotations

import pytest

from bftrainer.milp import Problem, TrainerSpec, allocate

SLOTS = 4
LINEAR = ((1.0, 100.0), (80.0, 8000.0))


def _trainer(tid: str, user: str) -> TrainerSpec:
    return TrainerSpec(
        id=tid,
        n_min=1,
        n_max=80,
        rescale_up_s=20.0,
        rescale_down_s=10.0,
        curve=LINEAR,
        user=user,
        account=f"acct-{user}",
    )


def _twenty_and_one(nodes: int, fair_by: str, p: float, **kw: object) -> Problem:
    """User "many" submitted 20 identical trainers, then user "one" submitted one, on
    ``nodes`` nodes of 4 slots."""
    trainers = tuple(_trainer(f"many{i:02d}", "many") for i in range(20))
    return Problem(
        pool=tuple(f"n{i}" for i in range(nodes)),
        trainers=(*trainers, _trainer("one", "one")),
        fairness_p=p,
        fair_by=fair_by,
        max_trainers=21,
        slots_per_node=SLOTS,
        **kw,  # type: ignore[arg-type]
    )


def _totals(counts: dict[str, int]) -> tuple[int, int]:
    return sum(n for k, n in counts.items() if k.startswith("many")), counts["one"]


@pytest.mark.parametrize("p", [0.0, -1.0])
@pytest.mark.parametrize("nodes", [10, 20])
@pytest.mark.parametrize("solver", ["dp", "highs"])
def test_a_user_with_twenty_trainers_does_not_crowd_out_a_user_with_one(
    p: float, nodes: int, solver: str
) -> None:
    slots = nodes * SLOTS
    by_trainer = allocate(_twenty_and_one(nodes, "trainer", p), solver=solver)
    many, one = _totals(dict(by_trainer.counts))
    assert many + one == slots
    assert one <= slots // 20  # one trainer among 21: about a 21st of the slots
    for fair_by in ("user", "account"):
        result = allocate(_twenty_and_one(nodes, fair_by, p), solver=solver)
        assert result.status == "optimal"
        # Identical linear curves: each user's total is half the slots, and "one"'s
        # are packed on whole nodes.
        assert _totals(dict(result.counts)) == (slots // 2, slots // 2)
        assert len(set(result.nodes["one"])) == slots // 2 // SLOTS


@pytest.mark.parametrize("fair_by", ["trainer", "user"])
def test_the_slot_level_model_agrees_with_the_count_model(fair_by: str) -> None:
    """Six trainers of "many" and one of "one" on 3 nodes of 4 slots: by user, half the
    12 slots each; by trainer, "one" gets about a seventh."""
    trainers = tuple(_trainer(f"many{i}", "many") for i in range(6))
    problem = Problem(
        pool=("a", "b", "c"),
        trainers=(*trainers, _trainer("one", "one")),
        fairness_p=-1.0,
        fair_by=fair_by,
        slots_per_node=SLOTS,
    )
    node = allocate(problem, formulation="node", solver="highs")
    count = allocate(problem, solver="dp")
    assert count.status == "optimal"
    assert node.objective == pytest.approx(count.objective, rel=1e-9)
    many, one = _totals(dict(node.counts))
    assert (many, one) == _totals(dict(count.counts))
    if fair_by == "user":
        assert (many, one) == (6, 6)
    else:
        assert one <= 2


def test_a_weight_gives_a_user_a_larger_share_of_the_slots() -> None:
    weighted = allocate(_twenty_and_one(20, "user", -1.0, fair_weights={"one": 2.0}), solver="dp")
    many, one = _totals(dict(weighted.counts))
    # As on whole nodes (test_fair_by.py): twice the weight, about twice the slots.
    assert many + one == 80 and 1.8 <= one / many <= 2.6


def test_with_fair_share_speedup_the_share_is_the_users_slots() -> None:
    result = allocate(_twenty_and_one(10, "user", -1.0, fair_share_speedup=True), solver="dp")
    assert _totals(dict(result.counts)) == (20, 20)


def test_a_small_user_shares_a_node_with_a_big_one() -> None:
    """Two nodes of 4 slots, user "many" with 3 trainers of n_max 4, user "one" with one:
    by user, "one" gets half the 8 slots, packed on one node."""
    trainers = tuple(_trainer(f"many{i}", "many") for i in range(3))
    problem = Problem(
        pool=("a", "b"),
        trainers=(*trainers, _trainer("one", "one")),
        fairness_p=-1.0,
        fair_by="user",
        slots_per_node=SLOTS,
    )
    result = allocate(problem, solver="dp")
    assert _totals(dict(result.counts)) == (4, 4)
    assert len(set(result.nodes["one"])) == 1
