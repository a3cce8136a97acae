"""Statistical efficiency and the learning-rate rules built on it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bftrainer.trainers.efficiency import BatchBelowBaseError, efficiency, gain, pgns_from_stats
from bftrainer.trainers.lr_scaling import RULES, UnknownLRRuleError, lr_rule

phis = st.floats(min_value=0.0, max_value=1e7)
bases = st.integers(min_value=1, max_value=4096)


def test_efficiency_formula_at_known_points() -> None:
    # (phi + M0) / (phi + M): phi = 300, M0 = 100, M = 500 -> 400 / 800.
    assert efficiency(500, 100, 300.0) == pytest.approx(0.5)
    assert efficiency(100, 100, 300.0) == pytest.approx(1.0)
    assert efficiency([100, 200], 100, 0.0) == pytest.approx([1.0, 0.5])  # no noise: M0 / M
    assert efficiency(10_000, 100, math.inf) == pytest.approx(1.0)  # pure noise


@given(phi=phis, m0=bases, k=st.integers(min_value=1, max_value=1000))
def test_efficiency_falls_with_batch_and_gain_rises(phi: float, m0: int, k: int) -> None:
    m = m0 * np.array([1, k, k + 1])
    e = efficiency(m, m0, phi)
    g = gain(m, m0, phi)
    assert np.all(np.diff(e) <= 1e-12) and np.all((e > 0) & (e <= 1))
    assert np.all(np.diff(g) >= -1e-9)
    assert np.all(g <= m / m0 + 1e-9) and np.all(g >= 1 - 1e-12)  # AdaScale: 1 <= r <= M/M0


def test_efficiency_below_the_base_batch_is_an_error() -> None:
    with pytest.raises(BatchBelowBaseError, match="50"):
        efficiency([50, 200], 100, 10.0)


def test_efficiency_matches_pollux_gain_on_base_batch_variance() -> None:
    # Pollux's simulator: gain = (var + sqr) / (var / scale + sqr), var at M0.
    sqr, var_at_m0, m0, m = 2.0, 3.0, 128, 1024
    scale = m / m0
    pollux_gain = (var_at_m0 + sqr) / (var_at_m0 / scale + sqr)
    phi = pgns_from_stats(sqr, var_at_m0 * m0)
    assert gain(m, m0, phi) == pytest.approx(pollux_gain)


def test_pgns_from_stats_edges() -> None:
    assert pgns_from_stats(2.0, 10.0) == 5.0
    assert pgns_from_stats(0.0, 10.0) == math.inf
    assert pgns_from_stats(1.0, 0.0) == 0.0


def test_linear_and_sqrt_rules() -> None:
    assert lr_rule("linear").factor(512, 128, None) == pytest.approx(4.0)
    assert lr_rule("sqrt").factor(512, 128, 1.0) == pytest.approx(2.0)


@given(phi=phis, m0=bases, k=st.integers(min_value=1, max_value=64))
def test_adascale_is_the_gain_and_lies_between_one_and_linear(phi: float, m0: int, k: int) -> None:
    m = m0 * k
    r = lr_rule("adascale").factor(m, m0, phi)
    assert r == pytest.approx(float(gain(m, m0, phi)))
    assert 1.0 - 1e-12 <= r <= k + 1e-9


def test_adascale_without_pgns_does_not_scale() -> None:
    assert lr_rule("adascale").factor(1024, 128, None) == 1.0


def test_rules_are_registered_by_name_and_unknown_names_are_named() -> None:
    assert set(RULES) == {"linear", "sqrt", "adascale"}
    with pytest.raises(UnknownLRRuleError, match="'cosine'"):
        lr_rule("cosine")
