"""A step returns its orders as data: inside the step's transaction the loop calls no
driver or pool method that acts or queues an action; it records the step's orders, and
the actuator carries out those same orders after the commit (issue 43).

Recording doubles stand for the daemon's parts (the live driver, the held pool): each
call is logged with whether the step's transaction was open."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.loop import (
    Arrival,
    Cancel,
    Demand,
    Loop,
    LoopState,
    LoopView,
    NodeChange,
    Orders,
    Planned,
    Polled,
    PoolChange,
    Progress,
    TimedSource,
    TrainerState,
    VirtualClock,
)
from bftrainer.policies.config import Config
from bftrainer.policies.registry import make_policy
from tests.bftrainer.test_loop import job

# What may run inside a step's transaction: reads that record, the recording of the
# orders and of what the last actions learnt, and a simulated trainer's cost accounting
# (preempt, rescale, cancel: the live driver's do nothing and cost 0).
INSIDE = {"advance", "poll", "plan", "learn", "record", "preempt", "rescale", "cancel"}
# What acts on the world, or asks it: only outside.
OUTSIDE = {"read", "act"}


class Log:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.inside = False

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        assert not self.inside, "transactions nest"
        self.inside = True
        try:
            yield
        finally:
            self.inside = False

    def __call__(self, name: str) -> None:
        self.calls.append((name, self.inside))


class Driver:
    """The driver and actuator of the daemon, as a double: it reports a dead
    supervisor's leftovers as an order, and learns a pid from each act."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.recorded: list[Orders] = []
        self.acted: list[Orders] = []
        self.learnt: list[object] = []

    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        self.log("advance")
        return Progress(orders=("end leftovers",) if now_s == 10.0 else ())

    def next_wakeup_s(self, trainers: Sequence[TrainerState], now_s: float) -> float:
        return math.inf

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        self.log("preempt")
        return 0.0

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        self.log("rescale")
        return 0.0

    def cancel(self, trainer: TrainerState) -> None:
        self.log("cancel")

    def learn(self, report: Sequence[object]) -> None:
        self.log("learn")
        self.learnt += report

    def record(self, orders: Orders) -> None:
        self.log("record")
        self.recorded.append(orders)

    def act(self, orders: Orders) -> Sequence[object]:
        self.log("act")
        self.acted.append(orders)
        return [f"pid at {orders.time_s:g}"] if orders.changes else []


class Pool:
    """The held pool as a double: a reader, a source that says how nodes are reached,
    and a planner that releases a node nobody uses."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.spare = {"n3"}  # held, used by no trainer: released once

    def read(self, now_s: float, view: LoopView | None = None) -> None:
        self.log("read")

    def poll(self, now_s: float) -> Polled:
        self.log("poll")
        return Polled((), math.inf, exec_plan=f"plan at {now_s:g}")

    def plan(self, now_s: float, decided: bool, demand: Demand) -> Planned:
        self.log("plan")
        released = frozenset(self.spare) if now_s == 20.0 else frozenset()
        self.spare -= released
        return Planned(released, plan=f"holders at {now_s:g}")


def test_inside_the_transaction_the_loop_only_records_and_acts_after_the_commit() -> None:
    log = Log()
    driver, pool = Driver(log), Pool(log)
    script = [
        (0.0, "arrive a"),
        (0.0, "arrive b"),
        (10.0, PoolChange(PoolEvent(10.0, left=frozenset({"n0"})))),  # a preemption
        (20.0, Cancel("b")),
    ]
    items = [(t, Arrival(job(i[-1], n_max=2)) if isinstance(i, str) else i) for t, i in script]
    config = Config(policy="equal")
    loop = Loop(
        [TimedSource(items), pool],
        driver,
        VirtualClock(0.0),
        config,
        policy=make_policy(config),
        state=LoopState(now_s=0.0, pool=("n0", "n1", "n2", "n3")),
        transaction=log.transaction,
        readers=[pool],
        planner=pool,
        actuator=driver,
    )
    loop.run(until_s=30.0)

    inside = {name for name, within in log.calls if within}
    outside = {name for name, within in log.calls if not within}
    assert inside <= INSIDE, f"called inside the transaction: {inside - INSIDE}"
    assert outside <= OUTSIDE, f"called outside the transaction: {outside - OUTSIDE}"
    assert {"advance", "poll", "plan", "learn", "record", "preempt", "rescale", "cancel"} <= inside
    assert outside == OUTSIDE

    # The actuator carries out exactly what each step recorded, once, in step order.
    assert driver.acted == driver.recorded
    assert [o.time_s for o in driver.acted] == sorted(o.time_s for o in driver.acted)
    by_time: dict[float, Orders] = {}
    for o in driver.recorded:  # the first of each instant (a step due at once may follow)
        by_time.setdefault(o.time_s, o)
    first = by_time[0.0]
    assert {c.trainer_id for c in first.changes if c.why == "decide"} == {"a", "b"}
    assert dict(first.decided) == {c.trainer_id: c.nodes for c in first.changes}
    assert first.exec_plan == "plan at 0" and first.hold == "holders at 0"
    preempted = by_time[10.0]
    assert next(c for c in preempted.changes if c.why == "preempt").before == 2
    assert preempted.driver == ("end leftovers",)  # the driver's own order, as data
    cancelled = by_time[20.0]
    assert cancelled.cancelled == ("b",)
    assert NodeChange("b", (), "cancel", 1) in cancelled.changes
    # The released node left the pool in the step that planned its release.
    assert "n3" not in loop.pool
    # What each act learnt was recorded at the next step's start, inside its transaction.
    assert driver.learnt == [f"pid at {o.time_s:g}" for o in driver.acted if o.changes]
