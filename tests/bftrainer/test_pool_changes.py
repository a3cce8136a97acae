"""The one pool diff of the daemon's held pool and the centre allocator's idle pool."""

from __future__ import annotations

from bftrainer.loop import WINDOW_TOLERANCE_S
from bftrainer.service.pool_changes import PoolChanges


def test_joins_leaves_and_moved_departures_are_told_once() -> None:
    changes = PoolChanges()
    first = changes.diff({"a", "b"}, {"a": 1_100.0}, 1_000.0)
    assert first is not None
    assert first.joined == {"a", "b"} and not first.left
    assert first.windows_s == {"a": 100.0, "b": None}  # every joined node's departure
    assert changes.diff({"a", "b"}, {"a": 1_100.0}, 1_010.0) is None  # nothing new
    # A departure that moves by less than the tolerance is not news; by more, it is.
    assert changes.diff({"a", "b"}, {"a": 1_100.0 + WINDOW_TOLERANCE_S / 2}, 1_020.0) is None
    moved = changes.diff({"a", "b"}, {"a": 1_100.0 + 2 * WINDOW_TOLERANCE_S}, 1_030.0)
    assert moved is not None and moved.empty
    assert moved.windows_s == {"a": 70.0 + 2 * WINDOW_TOLERANCE_S}
    gone = changes.diff({"b"}, {"b": 990.0}, 1_040.0)  # past departures clamp at 0
    assert gone is not None and gone.left == {"a"} and gone.windows_s == {"b": 0.0}


def test_a_restarted_source_tells_every_departure_again_and_forget_drops_nodes() -> None:
    changes = PoolChanges({"a", "b"})  # the loop restored on a and b
    again = changes.diff({"a", "b"}, {"a": 50.0}, 0.0)
    assert again is not None and again.empty and again.windows_s == {"a": 50.0, "b": None}
    changes.forget({"a"})  # released by the daemon within a step
    back = changes.diff({"a", "b"}, {"a": 50.0}, 0.0)
    assert back is not None and back.joined == {"a"} and back.windows_s == {"a": 50.0}


def test_started_on_a_pool_nothing_is_news_until_it_changes() -> None:
    changes = PoolChanges()
    changes.start({"a"}, {"a": 500.0})  # the centre's first read: the loop starts on it
    assert changes.diff({"a"}, {"a": 500.0}, 100.0) is None
    joined = changes.diff({"a", "c"}, {"a": 500.0}, 100.0)
    assert joined is not None and joined.joined == {"c"} and joined.windows_s == {"c": None}
