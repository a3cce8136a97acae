"""Policies are pure: every input comes in ``PolicyInputs``, so the same inputs give the
same decision, and deciding changes none of them (issue 43, part 2)."""

from __future__ import annotations

import copy
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from bftrainer.loop import Decision, Policy, PolicyInputs, TrainerState
from bftrainer.loop.churn import Churn
from bftrainer.loop.jobs import JobSpec
from bftrainer.policies.config import Config
from bftrainer.policies.follow import FollowPolicy
from bftrainer.policies.refusing import Refusing
from bftrainer.policies.registry import EqualSharePolicy, MilpPolicy, ScavengerPolicy

USERS = ("alice", "bob")


@st.composite
def policy_inputs(draw: st.DrawFn) -> PolicyInputs:
    """A pool, trainers on disjoint parts of it with their curves, the churn, the time,
    an assignment to follow and a table of refusals, some of them past."""
    pool = tuple(f"n{i:02d}" for i in range(draw(st.integers(0, 10))))
    free = list(pool)
    trainers = []
    for i in range(draw(st.integers(1, 4))):
        n_min = draw(st.integers(1, 3))
        n_max = draw(st.integers(n_min, 6))
        rates = sorted(draw(st.lists(st.floats(1.0, 100.0), min_size=n_max, max_size=n_max)))
        curve = tuple((float(n + 1), r) for n, r in enumerate(rates))
        job = JobSpec(
            f"t{i:04d}", "m", 0.0, n_min, n_max, 5.0, 3.0, 1e9, curve, draw(st.sampled_from(USERS))
        )
        held = draw(st.integers(0, min(n_max, len(free))))
        nodes, free = tuple(free[:held]), free[held:]
        trainers.append(TrainerState(job, nodes=nodes))
    some_nodes = st.lists(st.sampled_from(pool), unique=True, max_size=4) if pool else st.just([])
    assignment = {t.id: tuple(draw(some_nodes)) for t in trainers if draw(st.booleans())}
    now_s = draw(st.floats(0.0, 1000.0))
    refused = {
        (draw(st.sampled_from(USERS)), n): draw(st.floats(0.0, 2000.0)) for n in draw(some_nodes)
    }
    churn = Churn(draw(st.integers(0, 5)), draw(st.floats(0.0, 3600.0)))
    return PolicyInputs(pool, trainers, churn, now_s, assignment, refused)


POLICIES: dict[str, Callable[[], Policy]] = {
    "milp": lambda: MilpPolicy(Config(time_limit_s=5.0)),
    "equal": EqualSharePolicy,
    "scavenger": ScavengerPolicy,
    "follow": FollowPolicy,
    "refusing": lambda: Refusing(EqualSharePolicy()),
    "refusing-milp": lambda: Refusing(MilpPolicy(Config(time_limit_s=5.0))),
}


def answer(decision: Decision) -> tuple[object, ...]:
    """What a decision says, less the wall time its solver took."""
    return (dict(decision.nodes), decision.status, decision.t_fwd_s, decision.hold)


def check_twice(name: str, inputs: PolicyInputs) -> None:
    again = copy.deepcopy(inputs)
    before = copy.deepcopy(inputs)
    first = POLICIES[name]().decide(inputs)
    second = POLICIES[name]().decide(again)
    assert answer(first) == answer(second), name
    assert inputs == before, f"{name} changed its inputs"  # it decided, nothing else
    used = [n for nodes in first.nodes.values() for n in nodes]
    assert len(used) == len(set(used)) and set(used) <= set(inputs.pool), name


@settings(max_examples=40, deadline=None)
@given(policy_inputs())
def test_the_cheap_policies_decide_the_same_twice(inputs: PolicyInputs) -> None:
    for name in ("equal", "scavenger", "follow", "refusing"):
        check_twice(name, inputs)


@settings(max_examples=15, deadline=None)
@given(policy_inputs())
def test_the_milp_policies_decide_the_same_twice(inputs: PolicyInputs) -> None:
    for name in ("milp", "refusing-milp"):
        check_twice(name, inputs)


def test_refusals_come_with_their_times() -> None:
    """A refusal counts until its end in the inputs' time, and not after: the policy
    reads the time from its inputs, never from a clock."""
    job = JobSpec("t0001", "m", 0.0, 1, 2, 0.0, 0.0, 1e9, ((1.0, 1.0), (2.0, 2.0)), "bob")
    inputs = PolicyInputs(
        ("a", "b", "c"),
        [TrainerState(job)],
        Churn(),
        now_s=10.0,
        refused_until_s={("bob", "a"): 20.0},
    )
    policy = Refusing(EqualSharePolicy())
    assert policy.decide(inputs).nodes == {"t0001": ("b", "c")}
    later = PolicyInputs(inputs.pool, inputs.trainers, Churn(), 20.0, {}, inputs.refused_until_s)
    assert policy.decide(later).nodes == {"t0001": ("a", "b")}


def test_a_trainer_short_of_nodes_holding_more_than_it_can_keep_is_decided() -> None:
    """A trainer on the whole pool, one of its nodes refused to its user, while two
    others wait: it keeps fewer nodes than it held, and deciding again does not fail on
    a trainer holding more than its cap (CI found it, stop 45)."""
    pool = ("n00", "n01", "n02", "n03", "n04")
    curve = ((1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (4.0, 2.0), (5.0, 2.0))
    big = JobSpec("t0000", "m", 0.0, 1, 5, 5.0, 3.0, 1e9, curve, "alice")
    small = [
        JobSpec(f"t000{i}", "m", 0.0, 1, 1, 5.0, 3.0, 1e9, ((1.0, 1.0),), "alice") for i in (1, 2)
    ]
    inputs = PolicyInputs(
        pool,
        [TrainerState(big, nodes=pool), *(TrainerState(j) for j in small)],
        Churn(),
        now_s=0.0,
        refused_until_s={("alice", "n00"): 1.0},
    )
    for name in ("refusing", "refusing-milp"):
        check_twice(name, inputs)
        decided = POLICIES[name]().decide(inputs).nodes
        assert all("n00" not in nodes for nodes in decided.values()), name
