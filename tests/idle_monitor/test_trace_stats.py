"""Trace statistics on a hand-made trace whose figures are worked out in the comments."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.trace import Trace
from bftrainer.idle_monitor.trace_stats import (
    fragment_cdf,
    fragment_lengths_s,
    idle_counts,
    resource_integral_node_s,
    summarize,
    window_stats,
    write_plots,
)

T0 = 1_612_915_200.0  # 2021-02-10T00:00:00Z


def ev(t: float, joined: str = "", left: str = "") -> PoolEvent:
    return PoolEvent(T0 + t, frozenset(joined), frozenset(left))


# Four nodes over two hours. a is idle from before the start (a cut fragment, not counted);
# b idles 300 s, c 3000 s, d 2400 s; a idles again from 5400 s to past the end (cut).
HAND = Trace(
    nodes=("a", "b", "c", "d"),
    initial_idle=frozenset("a"),
    start_s=T0,
    end_s=T0 + 7200,
    events=(
        ev(600, joined="bc"),
        ev(900, left="b"),
        ev(1200, joined="d", left="a"),
        ev(3600, left="cd"),
        ev(5400, joined="a"),
    ),
)


def test_idle_counts_step_function() -> None:
    times, counts = idle_counts(HAND)
    assert list(times - T0) == [0, 600, 900, 1200, 3600, 5400]
    assert list(counts) == [1, 3, 2, 2, 0, 1]


def test_resource_integral() -> None:
    # 1x600 + 3x300 + 2x300 + 2x2400 + 0x1800 + 1x1800 node-seconds
    assert resource_integral_node_s(HAND) == 8700.0
    # between 1000 s and 2000 s: 2 nodes x 200 s + 2 nodes x 800 s
    assert resource_integral_node_s(HAND, T0 + 1000, T0 + 2000) == 2000.0


def test_fragments_exclude_the_ones_cut_by_the_trace_ends() -> None:
    assert sorted(fragment_lengths_s(HAND)) == [300.0, 2400.0, 3000.0]


def test_table_1_row() -> None:
    s = summarize(HAND)
    assert s.nodes == 4
    assert s.duration_h == 2.0
    assert s.events == 5
    assert s.inc_per_h == 1.5  # joins at 600, 1200, 5400 s
    assert s.dec_per_h == 1.5  # leaves at 900, 1200, 3600 s
    assert s.eq_nodes == pytest.approx(8700 / 7200)
    assert s.idle_ratio == pytest.approx(8700 / 7200 / 4)
    assert s.node_hours == pytest.approx(8700 / 3600)
    assert s.fragments == 3
    assert s.fragment_median_s == 2400.0
    assert s.fragment_mean_s == 1900.0
    assert s.fragment_p90_s == pytest.approx(2880.0)  # 2400 + 0.8 x (3000 - 2400)
    assert s.short_fragment_share == pytest.approx(1 / 3)  # only b is under 10 min
    assert s.short_fragment_time_share == pytest.approx(300 / 5700)
    assert s.start == "2021-02-10T00:00:00Z"
    assert s.end == "2021-02-10T02:00:00Z"


def test_undefined_figures_are_nan_and_null_in_json() -> None:
    empty = Trace(nodes=("a",), initial_idle=frozenset(), start_s=T0, end_s=T0, events=())
    s = summarize(empty)
    assert np.isnan(s.inc_per_h) and np.isnan(s.fragment_median_s)
    assert s.as_json()["inc_per_h"] is None


def test_window_stats() -> None:
    first, second = window_stats(HAND, window_s=3600)
    # first hour: events at 600, 900, 1200 s; 600 + 900 + 600 + 4800 idle node-seconds
    assert (first.events, first.inc, first.dec) == (3, 2, 2)
    assert first.idle_ratio == pytest.approx(6900 / (3600 * 4))
    # second hour: events at 3600 (in this bin) and 5400 s; 1 node for the last 1800 s
    assert (second.events, second.inc, second.dec) == (2, 1, 1)
    assert second.idle_ratio == pytest.approx(1800 / (3600 * 4))


def test_fragment_cdf_by_count_and_by_node_time() -> None:
    x, by_count, by_time = fragment_cdf(fragment_lengths_s(HAND))
    assert list(x) == [300.0, 2400.0, 3000.0]
    assert by_count == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert by_time == pytest.approx([300 / 5700, 2700 / 5700, 1.0])


def test_plots_are_written(tmp_path: Path) -> None:
    paths = write_plots(HAND, tmp_path / "plots")
    assert [p.name for p in paths] == ["fragments_cdf.png", "events_12h.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
