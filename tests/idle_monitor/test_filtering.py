"""The blip filter of the paper's section 2.1, on hand-made record sequences."""

from __future__ import annotations

import pytest

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.filtering import BlipFilter, RecordOrderError, filter_records


def rec(t: float, *idle: str) -> tuple[float, frozenset[str]]:
    return t, frozenset(idle)


def test_a_one_record_blip_is_not_a_join() -> None:
    # b is idle for one record between two jobs; c is idle for two and joins.
    records = [rec(0), rec(10, "b"), rec(20, "c"), rec(30, "c"), rec(40)]
    assert list(filter_records(records)) == [
        PoolEvent(30, joined=frozenset({"c"})),  # confirmed by the second record: one late
        PoolEvent(40, left=frozenset({"c"})),  # leaves are not delayed
    ]


def test_records_that_change_nothing_are_dropped() -> None:
    records = [rec(0, "a"), rec(10, "a"), rec(20, "a"), rec(30)]
    assert list(filter_records(records)) == [
        PoolEvent(0, joined=frozenset({"a"})),  # the initial pool
        PoolEvent(30, left=frozenset({"a"})),
    ]


def test_the_first_record_is_the_pool_unfiltered() -> None:
    # a is idle only in the first record: how long before is unknown, so it counts.
    assert list(filter_records([rec(0, "a"), rec(10)])) == [
        PoolEvent(0, joined=frozenset({"a"})),
        PoolEvent(10, left=frozenset({"a"})),
    ]


def test_a_node_idle_only_in_the_last_record_never_joins() -> None:
    assert list(filter_records([rec(0), rec(10), rec(20, "a")])) == []


def test_joins_and_leaves_in_one_event() -> None:
    records = [rec(0, "a"), rec(10, "b"), rec(20, "b"), rec(30, "b", "a"), rec(40, "a")]
    assert list(filter_records(records)) == [
        PoolEvent(0, joined=frozenset({"a"})),
        PoolEvent(10, left=frozenset({"a"})),
        PoolEvent(20, joined=frozenset({"b"})),
        PoolEvent(40, joined=frozenset({"a"}), left=frozenset({"b"})),
    ]


def test_incremental_state_for_a_live_source() -> None:
    live = BlipFilter()
    assert live.push(0, frozenset()) is None
    assert live.push(10, frozenset({"x", "y"})) is None
    assert live.pending == {"x", "y"}
    assert live.push(20, frozenset({"x"})) == PoolEvent(20, joined=frozenset({"x"}))
    assert live.pool == {"x"}
    assert live.pending == frozenset()
    with pytest.raises(RecordOrderError, match="t=15 is older than the previous one at t=20"):
        live.push(15, frozenset())
