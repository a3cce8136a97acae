"""The figures a centre quotes, one column per replay run or daemon, for the page's top.

Everything is computed from the frames (bftrainer/report/frames.py); a replay's U and its limit
are read from its summary, where the replay computed them from what the frames do not
hold (the workload's throughput curves).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from bftrainer.report.frames import Frames
from bftrainer.report.series import Grid, binned_mean, seconds, total_allocated

Row = tuple[str, list[str]]
MIN_SPAN = pd.Timedelta(minutes=1)


def span(f: Frames) -> tuple[pd.Timestamp, pd.Timestamp]:
    """The time the frames cover: the replay's or the asked range, else the records'."""
    times = pd.concat([f.pool["time"], f.allocations["time"]])
    start = f.start if f.start is not None else times.min()
    end = f.end if f.end is not None else times.max()
    return start, max(end, start + MIN_SPAN)  # records of one instant: a short span


def node_hours(f: Frames) -> tuple[float, float]:
    """(node-hours of the pool, node-hours given to trainers) over the span."""
    start, end = span(f)
    hours = max(0.0, (end - start).total_seconds()) / 3600
    pool = _mean(seconds(f.pool["time"]), f.pool["nodes"].to_numpy(float), start, end)
    given = _mean(*total_allocated(f.allocations), start, end) if len(f.allocations) else 0.0
    return pool * hours, given * hours


def _mean(times_s: np.ndarray, values: np.ndarray, start: pd.Timestamp, end: pd.Timestamp) -> float:
    grid = Grid(np.array([start.timestamp(), max(end.timestamp(), start.timestamp() + 1.0)]))
    return float(binned_mean(times_s, values, grid)[0])


def jct_hours(trainers: pd.DataFrame) -> pd.Series:
    """Submission to completion, hours, of the trainers that completed."""
    done = trainers[trainers["state"] == "done"]
    return (done["finished"] - done["submitted"]).dt.total_seconds() / 3600


def headline(runs: Sequence[Frames]) -> list[Row]:
    """Rows of (name, one cell per run)."""
    rows: list[tuple[str, Callable[[Frames], str]]] = [
        ("run", lambda f: f.label),
        ("hours", lambda f: f"{(span(f)[1] - span(f)[0]).total_seconds() / 3600:,.1f}"),
    ]
    if all(f.source == "replay" for f in runs):
        rows += [
            ("U (A_e / A_s)", lambda f: _pct(f.summary.get("utilization_efficiency"))),
            ("limit U_max (clairvoyant)", lambda f: _pct(f.summary.get("utilization_limit"))),
            ("U / U_max", lambda f: _pct(f.summary.get("utilization_share_of_limit"))),
            ("samples processed", lambda f: _samples(f.summary.get("samples_processed"))),
            ("rescale cost, samples", lambda f: _samples(f.summary.get("rescale_cost_samples"))),
            (
                "preemption cost, samples",
                lambda f: _samples(f.summary.get("preemption_cost_samples")),
            ),
        ]
    rows += [
        ("pool, node-hours", lambda f: _amount(node_hours(f)[0])),
        ("harvested, node-hours", lambda f: _amount(node_hours(f)[1])),
        ("harvested share", lambda f: _pct(_share(*node_hours(f)))),
        ("trainers done", _done),
        ("JCT p50 (h)", lambda f: _quantile(jct_hours(f.trainers), 0.5)),
        ("JCT p95 (h)", lambda f: _quantile(jct_hours(f.trainers), 0.95)),
        ("rescales", lambda f: f"{(f.allocations['change'] == 'rescale').sum():,}"),
        ("preemptions", lambda f: f"{(f.allocations['change'] == 'preempt').sum():,}"),
        ("decision latency p50 / p95 (ms)", _latency),
    ]
    return [(name, [fmt(f) for f in runs]) for name, fmt in rows]


def _done(f: Frames) -> str:
    return f"{(f.trainers['state'] == 'done').sum():,} / {len(f.trainers):,}"


def _latency(f: Frames) -> str:
    if "latency_s" not in f.events:
        return "not recorded"
    ms = f.events.loc[f.events["decided"], "latency_s"] * 1e3
    if ms.empty:
        return "-"
    return f"{ms.quantile(0.5):.1f} / {ms.quantile(0.95):.1f}"


def _amount(x: float) -> str:
    """Three significant digits for small amounts, whole numbers for large ones."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _share(pool: float, given: float) -> float | None:
    return given / pool if pool > 0 else None


def _quantile(values: pd.Series, q: float) -> str:
    return "-" if values.empty else f"{values.quantile(q):.2f}"


def _samples(x: object) -> str:
    """Samples to three significant digits with an SI prefix: 92.6 M, 0."""
    if not isinstance(x, int | float) or not math.isfinite(x):
        return "-"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale * 0.9995:  # 999,960 is "1 M", not "1e+03 k"
            return f"{x / scale:.3g} {prefix}"
    return f"{x:.3g}"


def _pct(u: object) -> str:
    if not isinstance(u, int | float) or not math.isfinite(u):
        return "-"
    return f"{100 * u:.1f}%"
