"""The step-function arithmetic the report's figures rest on (bftrainer/report/series.py),
against sums done by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bftrainer.report.series import Grid, binned_mean, busiest, node_seconds


def grid(*edges: float) -> Grid:
    return Grid(np.array(edges, float))


def test_a_bin_mean_weights_each_value_by_its_time() -> None:
    # 0 before 10, 4 from 10 to 15, 2 from 15 on
    means = binned_mean(np.array([10.0, 15.0]), np.array([4.0, 2.0]), grid(0, 10, 20, 30))
    assert means.tolist() == [0.0, 3.0, 2.0]


@given(
    st.lists(st.tuples(st.floats(0, 100), st.integers(0, 64)), min_size=1, max_size=30),
    st.integers(1, 50),
)
def test_bin_means_keep_the_integral(changes: list[tuple[float, int]], bins: int) -> None:
    """Node-hours are kept: the bins' means times their width add up to the integral."""
    changes.sort()
    t = np.array([c[0] for c in changes])
    v = np.array([c[1] for c in changes], float)
    g = Grid(np.linspace(0, 100, bins + 1))
    exact = sum(v[i] * ((t[i + 1] if i + 1 < len(t) else 100.0) - t[i]) for i in range(len(t)))
    assert (binned_mean(t, v, g) * g.width_s).sum() == pytest.approx(exact, abs=1e-6)


def test_node_seconds_are_clipped_to_the_range() -> None:
    at = lambda s: pd.Timestamp(s, unit="s", tz="UTC")  # noqa: E731
    a = pd.DataFrame(
        {
            "time": [at(0), at(10), at(5), at(30)],
            "trainer": ["a", "a", "b", "b"],
            "nodes": [2, 0, 1, 0],
        }
    )
    held = node_seconds(a, at(5), at(100))
    assert held.to_dict() == {"b": 25.0, "a": 10.0}  # b: 5..30 x 1; a: 5..10 x 2
    assert node_seconds(a, at(40), at(100)).empty


def test_the_busiest_window_is_where_the_integral_is_largest() -> None:
    t, v = np.array([0.0, 50.0, 70.0]), np.array([1.0, 9.0, 1.0])
    assert busiest(t, v, Grid(np.linspace(0, 100, 11)), 20.0) == 50.0
