"""The milp policy reuses a trainer's spec from its last decision (issue 39): over any
run of decisions its problems equal those a fresh policy builds for each, and a bad
holding is refused as the full construction refuses it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bftrainer.loop import PolicyInputs, TrainerState
from bftrainer.loop.churn import Churn
from bftrainer.loop.jobs import JobSpec
from bftrainer.milp import ProblemError
from bftrainer.policies.config import Config
from bftrainer.policies.registry import MilpPolicy

POOL = tuple(f"n{i:02d}" for i in range(12))


def jobs(count: int) -> list[JobSpec]:
    return [
        JobSpec(
            f"t{i:04d}",
            "m",
            0.0,
            1,
            4,
            5.0,
            3.0,
            1e9,
            ((1.0, 10.0 + i), (2.0, 19.0 + i), (4.0, 30.0 + i)),
            "alice" if i % 2 else "bob",
        )
        for i in range(count)
    ]


@st.composite
def runs(draw: st.DrawFn) -> list[PolicyInputs]:
    """Decisions in a row over a few jobs (the same objects throughout, as in a loop):
    at each, some of them admitted, holding disjoint nodes, some with a reported curve
    (kept as the same object or replaced by an equal or another one)."""
    all_jobs = jobs(draw(st.integers(1, 5)))
    reported = [
        ((1.0, 5.0), (4.0, 7.0)),
        ((1.0, 5.0), (4.0, 7.0)),  # equal, not the same object
        ((1.0, 1.0), (2.0, 2.0), (4.0, 3.0)),
    ]
    curves: dict[str, dict[str, tuple[tuple[float, float], ...]]] = {}
    out = []
    for _ in range(draw(st.integers(1, 6))):
        free = list(draw(st.permutations(POOL)))[: draw(st.integers(0, len(POOL)))]
        trainers = []
        for job in all_jobs:
            if not draw(st.booleans()):
                continue
            if draw(st.integers(0, 3)) == 0:
                which = draw(st.sampled_from(("throughput", "goodput", "throughput_spread")))
                curves.setdefault(job.id, {})[which] = draw(st.sampled_from(reported))
            held = draw(st.integers(0, min(4, len(free))))
            nodes, free = tuple(free[:held]), free[held:]
            trainers.append(TrainerState(job, nodes=nodes, reported_curves=curves.get(job.id, {})))
        windows = {n: draw(st.floats(0.0, 600.0)) for n in free if draw(st.booleans())}
        pool = tuple(sorted(set(free) | {n for t in trainers for n in t.nodes}))
        out.append(PolicyInputs(pool, trainers, Churn(1, 60.0, windows), 0.0))
    return out


def weights_by_id(tid: str) -> float:
    return 1.0 + int(tid[1:]) % 3


@settings(max_examples=60, deadline=None)
@given(runs(), st.sampled_from(("throughput", "goodput")), st.booleans())
def test_a_policy_builds_the_problem_a_fresh_one_builds(
    run: list[PolicyInputs], objective: str, weighted: bool
) -> None:
    config = Config(time_limit_s=5.0, objective=objective)
    weights = weights_by_id if weighted else None
    policy = MilpPolicy(config, weights=weights)
    for inputs in run:
        kept = policy.problem(inputs)
        fresh = MilpPolicy(config, weights=weights).problem(inputs)
        assert kept == fresh
        for a, b in zip(kept.trainers, fresh.trainers, strict=True):
            assert a.__dict__ == b.__dict__  # every field, not only those compared
            assert a.curve is b.curve and a.spread_curve is b.spread_curve


def test_the_spec_is_reused_while_nothing_changed_and_rebuilt_otherwise() -> None:
    job, other = jobs(2)
    policy = MilpPolicy(Config())
    t = TrainerState(job, nodes=("n00",))
    first = policy.problem(PolicyInputs(POOL, [t], Churn(), 0.0)).trainers[0]
    again = policy.problem(PolicyInputs(POOL, [t], Churn(), 1.0)).trainers[0]
    assert again is first  # nothing changed
    t.nodes = ("n00", "n01")
    moved = policy.problem(PolicyInputs(POOL, [t], Churn(), 2.0)).trainers[0]
    assert moved is not first and moved == replace(first, nodes=("n00", "n01"))
    t.reported_curves["throughput"] = ((1.0, 1.0), (4.0, 2.0))
    relearnt = policy.problem(PolicyInputs(POOL, [t], Churn(), 3.0)).trainers[0]
    assert relearnt.curve == ((1.0, 1.0), (4.0, 2.0))
    # A trainer absent from a decision is forgotten: only the last decision's are kept.
    policy.problem(PolicyInputs(POOL, [TrainerState(other)], Churn(), 4.0))
    assert set(policy._specs) == {other.id}
    # The same id with another job (a new record) is built from the new job.
    bigger = replace(job, n_max=8, curve=((1.0, 1.0), (8.0, 8.0)))
    rebuilt = policy.problem(PolicyInputs(POOL, [TrainerState(bigger)], Churn(), 5.0))
    assert rebuilt.trainers[0].n_max == 8


def test_a_reused_spec_holding_too_many_nodes_is_refused_as_a_new_one_is() -> None:
    job = jobs(1)[0]
    policy = MilpPolicy(Config())
    t = TrainerState(job, nodes=("n00",))
    policy.problem(PolicyInputs(POOL, [t], Churn(), 0.0))
    t.nodes = POOL[:5]  # n_max is 4
    with pytest.raises(ProblemError) as reused:
        policy.problem(PolicyInputs(POOL, [t], Churn(), 1.0))
    with pytest.raises(ProblemError) as fresh:
        MilpPolicy(Config()).problem(PolicyInputs(POOL, [t], Churn(), 1.0))
    assert str(reused.value) == str(fresh.value)
    assert "holds 5 nodes, more than n_max 4" in str(reused.value)
