"""A newcomer waits for the nodes being held for it rather than take a running trainer's.

In the daemon a trainer's arrival raises the demand and the held pool holds more nodes,
which join a poll later. Deciding before they join shrank the running trainer for the
newcomer, then grew it back on the new nodes: two rescales (for Horovod, the workers of
the nodes it lost aborted) for nothing, at every arrival. Seen in the daemon's
end-to-end test: "t0001 rescaled: 4 -> 2", then "2 -> 4" one second later.
"""

from __future__ import annotations

import pytest

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.loop import (
    WAIT_FOR_HELD_S,
    Arrival,
    Demand,
    Loop,
    LoopState,
    Planned,
    PoolChange,
    TimedSource,
    VirtualClock,
)
from bftrainer.policies.config import Config
from bftrainer.policies.registry import make_policy
from tests.bftrainer.test_loop import ScriptedDriver, job

HELD = ("n1", "n2", "n3", "n4")
COMING = frozenset({"n5", "n6", "n7", "n8"})


class Holding:
    """The held pool's answer as data: how many pool nodes it could hold."""

    def __init__(self, holdable: int) -> None:
        self.holdable = holdable

    def plan(self, now_s: float, decided: bool, demand: Demand) -> Planned:
        return Planned(holdable=self.holdable)


def run_loop(
    script: list[tuple[float, object]], holdable: int, policy: str = "equal"
) -> ScriptedDriver:
    """The loop on the 4 held nodes, with the held pool's ``holdable``, until 100 s."""
    config = Config(policy=policy)
    driver = ScriptedDriver()
    Loop(
        [TimedSource(script)],
        driver,
        VirtualClock(0.0),
        config,
        policy=make_policy(config),
        state=LoopState(now_s=0.0, pool=HELD),
        planner=Holding(holdable),
    ).run(until_s=100.0)
    return driver


def nodes_over_time(holdable: int, join_s: float | None, policy: str = "equal") -> dict:
    """a arrives at 0 on the 4 held nodes, b at 10; the 4 coming nodes join at
    ``join_s`` (None: never). Each trainer's node counts as the loop set them."""
    script: list[tuple[float, object]] = [
        (0.0, Arrival(job("a", n_max=4))),
        (10.0, Arrival(job("b", n_max=4))),
    ]
    if join_s is not None:
        script.append((join_s, PoolChange(PoolEvent(join_s, joined=COMING))))
    out: dict[str, list[tuple[float, int]]] = {"a": [], "b": []}
    for name, at_s, detail in run_loop(script, holdable, policy).calls:
        if name == "rescale":
            tid, nodes = detail
            out[tid].append((at_s, len(nodes)))
    return out


@pytest.mark.parametrize("policy", ["equal", "milp"])
def test_a_newcomer_waits_for_the_nodes_held_for_it(policy: str) -> None:
    seen = nodes_over_time(holdable=8, join_s=11.0, policy=policy)
    assert seen["a"] == [(0.0, 4)]  # never shrunk
    assert seen["b"] == [(11.0, 4)]  # on the new nodes, as soon as they joined


def test_the_wait_is_bounded_when_the_nodes_never_come() -> None:
    seen = nodes_over_time(holdable=8, join_s=None)
    assert seen["a"] == [(0.0, 4), (10.0 + WAIT_FOR_HELD_S, 2)]
    assert seen["b"] == [(10.0 + WAIT_FOR_HELD_S, 2)]


def test_with_no_node_to_hold_the_pool_is_shared_at_once() -> None:
    seen = nodes_over_time(holdable=4, join_s=None)
    assert seen["a"] == [(0.0, 4), (10.0, 2)]
    assert seen["b"] == [(10.0, 2)]


def test_a_decision_that_only_grows_is_not_put_off() -> None:
    """b's arrival takes nothing while a holds 2 of 4 held nodes: b starts at once."""
    script = [(0.0, Arrival(job("a", n_max=2))), (10.0, Arrival(job("b", n_max=4)))]
    driver = run_loop(script, holdable=8)
    starts = [(at, d) for name, at, d in driver.calls if name == "rescale"]
    assert starts == [(0.0, ("a", ("n1", "n2"))), (10.0, ("b", ("n3", "n4")))]
