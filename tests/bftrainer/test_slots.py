"""Slot indices on shared nodes: stable while a trainer stays, never two trainers' at
once, whatever order the loop hands a decision's changes out in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from bftrainer.daemon.slot_book import SlotBook, SlotError, host_counts
from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.loop import (
    Arrival,
    Decision,
    Loop,
    LoopState,
    Orders,
    PolicyInputs,
    PoolChange,
    TimedSource,
    VirtualClock,
)
from bftrainer.policies.config import Config
from bftrainer.policies.registry import Admission
from tests.bftrainer.test_loop import ScriptedDriver, job


def test_host_counts_give_horovods_host_slots() -> None:
    assert host_counts(("b", "a", "b")) == [("a", 1), ("b", 2)]
    assert host_counts(()) == []


def test_a_grow_appends_the_lowest_free_slots_and_a_shrink_drops_the_last() -> None:
    book = SlotBook(4)
    assert book.assign("t1", ("n1", "n1")) == {"n1": (0, 1)}
    assert book.assign("t2", ("n1",)) == {"n1": (2,)}
    assert book.assign("t1", ("n1",)) == {"n1": (0,)}  # its local rank 1 leaves
    # t2 grows: its first slot stays where its worker runs, the next is the lowest free.
    assert book.assign("t2", ("n1", "n1", "n2")) == {"n1": (2, 1), "n2": (0,)}
    assert book.assign("t2", ("n1",)) == {"n1": (2,)}
    assert book.holders("n1") == {"t1": (0,), "t2": (2,)}
    book.release("t1")
    assert book.holders("n1") == {"t2": (2,)}
    assert book.slots("t1") == {}


def test_more_slots_than_a_node_has_free_is_refused_with_both_trainers_named() -> None:
    book = SlotBook(2)
    book.assign("t1", ("n1", "n1"))
    with pytest.raises(SlotError, match=r"node n1 has 2 slot\(s\): t2 is given 1, others hold"):
        book.assign("t2", ("n1",))


def test_a_decision_placed_whole_frees_before_it_gives() -> None:
    book = SlotBook(2)
    book.assign("t1", ("n1",))
    book.assign("t2", ("n1",))
    # t1 (first in arrival order) grows into the slot t2 gives up.
    book.place({"t1": ("n1", "n1"), "t2": ()})
    assert book.slots("t1") == {"n1": (0, 1)}
    assert book.slots("t2") == {}


def test_a_restore_keeps_the_slots_that_still_exist_and_counts_the_others() -> None:
    # Stored with S = 2; the daemon comes back with S = 1.
    book = SlotBook(1)
    assert book.restore("t1", ("n1",), {"n1": (1,)}) == ({}, {"n1": 1})
    assert book.restore("t2", ("n1", "n2"), {"n1": (0,), "n2": (1,)}) == (
        {"n1": (0,)},
        {"n2": 1},
    )
    # Rows of S = 1 carry no indices: the lowest free, a node once.
    book = SlotBook(2)
    assert book.restore("t1", ("n1",), {}) == ({"n1": (0,)}, {})
    assert book.restore("t2", ("n1", "n1"), {}) == ({"n1": (1,)}, {"n1": 1})


class ScriptedDecisions(Admission):
    """Returns the given decisions in turn."""

    name = "scripted"

    def __init__(self, decisions: Sequence[Mapping[str, tuple[str, ...]]]) -> None:
        self.decisions = list(decisions)

    def decide(self, inputs: PolicyInputs) -> Decision:
        return Decision(self.decisions.pop(0))


class SlotDriver(ScriptedDriver):
    """A driver that keeps a slot book as the live one does: from the step's orders,
    the decision whole first (it is its own actuator)."""

    def __init__(self) -> None:
        super().__init__()
        self.book = SlotBook(2)
        self.placed: list[dict[str, tuple[str, ...]]] = []

    def learn(self, report: Sequence[object]) -> None:
        pass

    def record(self, orders: Orders) -> None:
        if orders.decided:
            self.placed.append(dict(orders.decided))
            self.book.place(orders.decided)
        for change in orders.changes:
            self.book.assign(change.trainer_id, change.nodes)

    def act(self, orders: Orders) -> Sequence[object]:
        return ()


def test_the_loop_shows_a_placer_the_whole_decision_before_handing_it_out() -> None:
    driver = SlotDriver()
    policy = ScriptedDecisions(
        [
            {"t1": ("a",), "t2": ("a",)},
            # A grower listed before the trainer whose slot it takes.
            {"t1": ("a", "a"), "t2": ()},
        ]
    )
    script = [
        (0.0, Arrival(job("t1", n_max=2))),
        (0.0, Arrival(job("t2", n_max=2))),
        (10.0, PoolChange(PoolEvent(10.0, joined=frozenset({"b"})))),
    ]
    loop = Loop(
        [TimedSource(script)],
        driver,
        VirtualClock(0.0),
        Config(slots_per_node=2),
        policy=policy,
        state=LoopState(now_s=0.0, pool=("a",)),
        actuator=driver,
    )
    loop.run(until_s=20.0)
    assert driver.placed == [{"t1": ("a",), "t2": ("a",)}, {"t1": ("a", "a"), "t2": ()}]
    assert driver.book.slots("t1") == {"a": (0, 1)}  # its first slot never moved
    assert loop.trainers["t1"].nodes == ("a", "a")
