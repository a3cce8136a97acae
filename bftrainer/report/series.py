"""Step functions of time (the pool's size, a trainer's nodes) averaged over bins.

A week of Summit has tens of thousands of changes; a picture has a thousand pixels
across. Averaging each step function over the same bins (weighted by time, so node-
hours are kept) makes the stacked areas line up and the drawing cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

# Bins across a figure: finer than the eye needs at 1,000 px, coarse enough to draw fast.
BINS = 1000


@dataclass(frozen=True)
class Grid:
    """Bin edges in epoch seconds, from ``start`` to ``end``."""

    edges_s: np.ndarray

    @classmethod
    def over(cls, start: pd.Timestamp, end: pd.Timestamp, bins: int = BINS) -> Grid:
        lo, hi = start.timestamp(), end.timestamp()
        return cls(np.linspace(lo, max(hi, lo + 1.0), bins + 1))

    @classmethod
    def windows(cls, start: pd.Timestamp, end: pd.Timestamp, window_s: float) -> Grid:
        """Windows of ``window_s`` from ``start``, the last one cut at ``end`` (as the
        replay's windows.csv)."""
        lo, hi = start.timestamp(), max(end.timestamp(), start.timestamp() + 1.0)
        return cls(np.append(np.arange(lo, hi, window_s), hi))

    @property
    def width_s(self) -> float:
        """The first bin's width (all of them, but for the last of ``windows``)."""
        return float(self.edges_s[1] - self.edges_s[0])

    @property
    def times(self) -> pd.DatetimeIndex:
        """The bins' left edges, as UTC datetimes (for plotting with ``step="post"``)."""
        return pd.to_datetime(self.edges_s, unit="s", utc=True)


def seconds(times: pd.Series) -> np.ndarray:
    """UTC datetimes as epoch seconds (floats)."""
    return (times - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy(dtype=float)


def binned_mean(times_s: np.ndarray, values: np.ndarray, grid: Grid) -> np.ndarray:
    """The time-weighted mean over each bin of the step function that is ``values[i]``
    from ``times_s[i]`` (sorted) until the next change, and 0 before the first."""
    edges = grid.edges_s
    if len(times_s) == 0:
        return np.zeros(len(edges) - 1)
    t = np.asarray(times_s, float)
    v = np.asarray(values, float)
    # The integral from -inf up to each change point, then up to each edge.
    cum = np.concatenate([[0.0], np.cumsum(v[:-1] * np.diff(t))])
    j = np.searchsorted(t, edges, side="right") - 1
    inside = j >= 0
    area = np.zeros(len(edges))
    area[inside] = cum[j[inside]] + v[j[inside]] * (edges[inside] - t[j[inside]])
    return np.diff(area) / np.diff(edges)


def last_per_time(df: pd.DataFrame, key: str | None = None) -> pd.DataFrame:
    """Keep the last row of each instant (of each ``key``): several changes at one
    instant (a preemption, then the decision) leave only the final value."""
    subset = ["time", key] if key else ["time"]
    return df.drop_duplicates(subset, keep="last")


def node_seconds(allocations: pd.DataFrame, start: pd.Timestamp, end: pd.Timestamp) -> pd.Series:
    """Node-seconds each trainer held between ``start`` and ``end``, largest first
    (trainers that held none there are left out)."""
    a = last_per_time(allocations, "trainer").sort_values(["trainer", "time"], kind="stable")
    lo, hi = start.timestamp(), end.timestamp()
    t = np.maximum(seconds(a["time"]), lo)
    following = a.groupby("trainer", sort=False)["time"].shift(-1).fillna(end)
    held = a["nodes"].to_numpy(float) * np.maximum(0.0, np.minimum(seconds(following), hi) - t)
    total = pd.Series(held, index=a["trainer"].to_numpy()).groupby(level=0).sum()
    return total[total > 0].sort_values(ascending=False, kind="stable")


def busiest(times_s: np.ndarray, values: np.ndarray, grid: Grid, length_s: float) -> float:
    """The start (epoch s, on a bin edge) of the ``length_s`` window of ``grid`` where
    the step function's integral is largest: where the trainers did most."""
    k = max(1, min(len(grid.edges_s) - 1, round(length_s / grid.width_s)))
    per_bin = binned_mean(times_s, values, grid)
    window = np.convolve(per_bin, np.ones(k), mode="valid")  # sums of k bins in a row
    return float(grid.edges_s[int(np.argmax(window))])


def total_allocated(allocations: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The nodes held by all trainers together, as a step function (times_s, values)."""
    a = last_per_time(allocations, "trainer").sort_values("time", kind="stable")
    before = a.groupby("trainer", sort=False)["nodes"].shift(1).fillna(0)
    total = (a["nodes"] - before).cumsum()
    steps = pd.DataFrame({"time": a["time"], "nodes": total}).drop_duplicates("time", keep="last")
    return seconds(steps["time"]), steps["nodes"].to_numpy(float)


def trainer_steps(allocations: pd.DataFrame, trainer: str) -> tuple[np.ndarray, np.ndarray]:
    """One trainer's nodes as a step function (times_s, values)."""
    a = last_per_time(allocations[allocations["trainer"] == trainer], "trainer")
    return seconds(a["time"]), a["nodes"].to_numpy(float)
