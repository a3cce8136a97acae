"""The synthetic generator: reproducible, and calibrated to the published Summit figures."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bftrainer.idle_monitor.synthetic import (
    SyntheticConfig,
    SyntheticConfigError,
    synthetic_trace,
)
from bftrainer.idle_monitor.trace import Trace, load_trace, write_trace
from bftrainer.idle_monitor.trace_stats import fragment_lengths_s, summarize
from tests.shared_data import SHARED

FRAGMENTS = SHARED / "bftrainer-traces" / "idle_fragments_seconds.csv"


@pytest.fixture(scope="module")
def summit_week() -> Trace:
    """A Summit-sized week (about 1 s to generate): enough fragments for tight figures."""
    return synthetic_trace(SyntheticConfig(nodes=4608, duration_s=7 * 24 * 3600.0, seed=0))


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    config = SyntheticConfig(nodes=64, duration_s=6 * 3600.0, seed=7)
    assert synthetic_trace(config) == synthetic_trace(config)
    assert synthetic_trace(config).events != synthetic_trace(replace(config, seed=8)).events


def test_a_small_trace_is_a_slice_of_a_summit_sized_one() -> None:
    config = SyntheticConfig(nodes=4608, duration_s=3 * 3600.0, seed=3)
    whole = synthetic_trace(config)
    part = synthetic_trace(replace(config, nodes=256))
    assert replace(part, source="") == replace(whole.slice(nodes=slice(0, 256)), source="")


def test_events_are_on_the_poll_grid_and_inside_the_trace() -> None:
    config = SyntheticConfig(nodes=512, duration_s=4 * 3600.0, seed=1, poll_s=30.0)
    trace = synthetic_trace(config)
    assert trace.start_s == config.start_s
    assert trace.end_s == config.start_s + config.duration_s
    offsets = np.array([e.time_s - trace.start_s for e in trace.events])
    assert offsets.size > 50
    assert np.all((offsets > 0) & (offsets <= config.duration_s))
    assert np.all(offsets % 30.0 == 0)


def test_written_and_read_back_unchanged(tmp_path: Path) -> None:
    trace = synthetic_trace(SyntheticConfig(nodes=128, duration_s=3 * 3600.0, seed=2))
    write_trace(trace, tmp_path / "s.csv.gz")
    again = load_trace(tmp_path / "s.csv.gz")
    assert replace(again, source=trace.source) == trace


@pytest.mark.parametrize(
    ("field", "value"), [("nodes", 0), ("duration_s", -1.0), ("poll_s", 0.0), ("group_sigma", -1)]
)
def test_bad_options_are_named(field: str, value: float) -> None:
    with pytest.raises(SyntheticConfigError, match=f"{field}={value!r}"):
        SyntheticConfig(**{field: value})


def test_calibrated_to_the_published_summit_figures(summit_week: Trace) -> None:
    """BFTrainer paper, section 2: Summit's idle fragments and events (tolerances stated)."""
    s = summarize(summit_week)
    assert 36 <= s.inc_per_h <= 44  # ~40 events with joins per hour, +-10%
    assert 27 <= s.dec_per_h <= 33  # ~30 events with leaves per hour, +-10%
    assert 0.09 <= s.idle_ratio <= 0.11  # 9-11% of nodes idle
    assert 7 * 60 <= s.fragment_median_s <= 9 * 60  # median ~8 min
    assert 50 * 60 <= s.fragment_p90_s <= 62 * 60  # p90 ~56 min, +-10%
    assert 1085 <= s.fragment_mean_s <= 1325  # mean 1,205 s, +-10%
    assert 0.55 <= s.short_fragment_share <= 0.61  # ~58% shorter than 10 min...
    assert 0.08 <= s.short_fragment_time_share <= 0.12  # ...holding only ~10% of node-time


@pytest.mark.data
@pytest.mark.skipif(not FRAGMENTS.exists(), reason=f"Summit fragments not found at {FRAGMENTS}")
def test_fragment_lengths_match_the_real_ones(summit_week: Trace) -> None:
    real = np.loadtxt(FRAGMENTS, skiprows=1)
    synthetic = fragment_lengths_s(summit_week)
    quantiles = [10, 25, 50, 75, 90, 99]
    ratio = np.percentile(synthetic, quantiles) / np.percentile(real, quantiles)
    assert np.all(np.abs(ratio - 1) <= 0.15), dict(zip(quantiles, ratio.round(2), strict=True))
    # Kolmogorov-Smirnov distance between the two length distributions
    grid = np.union1d(real, synthetic)
    cdf_real = np.searchsorted(np.sort(real), grid, side="right") / real.size
    cdf_syn = np.searchsorted(np.sort(synthetic), grid, side="right") / synthetic.size
    assert np.max(np.abs(cdf_real - cdf_syn)) < 0.1
