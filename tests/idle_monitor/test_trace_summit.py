"""The real Summit week loads as-is, strictly, with the figures its README states."""

from __future__ import annotations

import pytest

from bftrainer.idle_monitor.trace import load_trace, parse_time_s
from tests.shared_data import SHARED

SUMMIT_WEEK = SHARED / "bftrainer-traces" / "summit_week1_node_events.csv.gz"

pytestmark = [
    pytest.mark.data,
    pytest.mark.skipif(not SUMMIT_WEEK.exists(), reason=f"Summit log not found at {SUMMIT_WEEK}"),
]


def test_summit_week_loads_strictly() -> None:
    trace = load_trace(SUMMIT_WEEK, strict=True)  # every node is in the first snapshot
    assert len(trace.nodes) == 4734
    assert len(trace.events) + 1 == 11468  # README: 11,468 events counting the snapshot
    assert trace.start_s == parse_time_s("2021-02-10 00:08:52")
    assert trace.end_s < parse_time_s("2021-02-17 00:00:00")
    assert trace.nodes[0] == "c05n06"  # first-seen order, not sorted
    changes = sum(len(e.joined) + len(e.left) for e in trace.events)
    assert changes + len(trace.nodes) == 423094  # README: rows (every row is a change)


def test_first_1024_nodes_slice() -> None:
    trace = load_trace(SUMMIT_WEEK, nodes=slice(0, 1024))
    assert len(trace.nodes) == 1024
    assert all(e.joined or e.left for e in trace.events)
    assert all((e.joined | e.left) <= set(trace.nodes) for e in trace.events)
