"""Pool-trace statistics: the BFTrainer paper's Table 1 row, Fig. 1 and Fig. 6.

Definitions (as in the paper):
- INC/h and DEC/h: events (timestamps after the snapshot) with at least one join, resp. one
  leave, per hour of trace. An event with both counts in both.
- Resource integral R: the sum over time of the number of idle nodes, in node-seconds.
  eq-nodes = R / duration (how many dedicated nodes the pool is worth); idle ratio =
  eq-nodes / nodes (the mean share of idle nodes).
- Idle fragment: one node's idle time, from a join to the next leave. Only fragments that
  both start and end inside the trace count; the ones open at the start or end are cut
  and would bias the lengths down.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from bftrainer.common.plotting import agg_pyplot
from bftrainer.idle_monitor.trace import Trace, format_time

log = logging.getLogger(__name__)

SHORT_FRAGMENT_S = 600.0
"""The paper's "shorter than 10 minutes"."""
WINDOW_S = 12 * 3600.0
"""Fig. 6 bins: 12 hours."""
QUIET_S = 6 * 3600.0
"""A stretch this long in which no node leaves the pool (no job starts) is flagged as a
possible outage: a job log has no maintenance windows, so a machine that was down looks
idle."""


@dataclass(frozen=True)
class TraceSummary:
    """One trace's figures; rates and shares are NaN when undefined (no time, no fragment)."""

    source: str
    nodes: int
    start: str
    end: str
    duration_h: float
    events: int
    inc_per_h: float
    dec_per_h: float
    idle_ratio: float
    eq_nodes: float
    node_hours: float
    fragments: int
    fragment_median_s: float
    fragment_mean_s: float
    fragment_p90_s: float
    short_fragment_share: float
    short_fragment_time_share: float
    possible_outages: tuple[tuple[float, float], ...] = ()

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict: NaN becomes null; outages as start, end and hours."""
        out = {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in asdict(self).items()
        }
        out["possible_outages"] = [
            {"start": format_time(a), "end": format_time(b), "hours": round((b - a) / 3600, 2)}
            for a, b in self.possible_outages
        ]
        return out


@dataclass(frozen=True)
class WindowStats:
    """Fig. 6: one time bin's events and mean idle share."""

    start_s: float
    end_s: float
    events: int
    inc: int
    dec: int
    idle_ratio: float


def idle_counts(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Step function of the pool size: ``counts[i]`` idle nodes from ``times[i]`` on.

    ``times`` starts with ``start_s`` and holds every event time; the last step lasts until
    ``end_s``.
    """
    times = np.empty(len(trace.events) + 1)
    counts = np.empty(len(trace.events) + 1, dtype=np.int64)
    times[0] = trace.start_s
    counts[0] = idle = len(trace.initial_idle)
    for i, event in enumerate(trace.events, start=1):
        idle += len(event.joined) - len(event.left)
        times[i] = event.time_s
        counts[i] = idle
    return times, counts


def resource_integral_node_s(
    trace: Trace, start_s: float | None = None, end_s: float | None = None
) -> float:
    """Idle node-seconds between ``start_s`` and ``end_s`` (default: the whole trace)."""
    times, counts = idle_counts(trace)
    lo = trace.start_s if start_s is None else max(start_s, trace.start_s)
    hi = trace.end_s if end_s is None else min(end_s, trace.end_s)
    if hi <= lo:
        return 0.0
    step_end = np.append(times[1:], trace.end_s)
    spans = np.clip(np.minimum(step_end, hi) - np.maximum(times, lo), 0.0, None)
    return float(np.dot(spans, counts))


def fragment_lengths_s(trace: Trace) -> np.ndarray:
    """Lengths of the idle fragments that start and end inside the trace, in event order."""
    since: dict[str, float] = {}
    lengths: list[float] = []
    for event in trace.events:
        for node in event.left:
            started = since.pop(node, None)
            if started is not None:
                lengths.append(event.time_s - started)
        for node in event.joined:
            since[node] = event.time_s
    return np.asarray(lengths, dtype=float)


def summarize(trace: Trace) -> TraceSummary:
    duration_s = trace.duration_s
    hours = duration_s / 3600.0
    inc = sum(1 for e in trace.events if e.joined)
    dec = sum(1 for e in trace.events if e.left)
    node_s = resource_integral_node_s(trace)
    eq_nodes = node_s / duration_s if duration_s > 0 else math.nan
    lengths = fragment_lengths_s(trace)
    total_s = float(lengths.sum())
    short = lengths < SHORT_FRAGMENT_S
    has = lengths.size > 0
    return TraceSummary(
        source=trace.source,
        nodes=len(trace.nodes),
        start=format_time(trace.start_s),
        end=format_time(trace.end_s),
        duration_h=hours,
        events=len(trace.events),
        inc_per_h=inc / hours if hours > 0 else math.nan,
        dec_per_h=dec / hours if hours > 0 else math.nan,
        idle_ratio=eq_nodes / len(trace.nodes) if trace.nodes else math.nan,
        eq_nodes=eq_nodes,
        node_hours=node_s / 3600.0,
        fragments=int(lengths.size),
        fragment_median_s=float(np.median(lengths)) if has else math.nan,
        fragment_mean_s=float(lengths.mean()) if has else math.nan,
        fragment_p90_s=float(np.percentile(lengths, 90)) if has else math.nan,
        short_fragment_share=float(short.mean()) if has else math.nan,
        short_fragment_time_share=float(lengths[short].sum() / total_s)
        if total_s > 0
        else math.nan,
        possible_outages=quiet_spells(trace),
    )


def quiet_spells(trace: Trace, min_s: float = QUIET_S) -> tuple[tuple[float, float], ...]:
    """Stretches of at least ``min_s`` in which no node left the pool (``QUIET_S``)."""
    leaves = [trace.start_s, *(e.time_s for e in trace.events if e.left), trace.end_s]
    return tuple((a, b) for a, b in pairwise(leaves) if b - a >= min_s)


def window_stats(trace: Trace, window_s: float = WINDOW_S) -> list[WindowStats]:
    """Fig. 6: events and mean idle share per ``window_s`` bin from the trace's start."""
    if window_s <= 0:
        raise ValueError(f"window_s={window_s!r} must be positive")
    bins = max(1, math.ceil(trace.duration_s / window_s))
    edges = [trace.start_s + i * window_s for i in range(bins)] + [trace.end_s]
    event_bins = np.clip(
        ((np.array([e.time_s for e in trace.events]) - trace.start_s) // window_s).astype(int),
        0,
        bins - 1,
    )
    out: list[WindowStats] = []
    for b in range(bins):
        lo, hi = edges[b], min(edges[b + 1], trace.end_s)
        members = [trace.events[i] for i in np.flatnonzero(event_bins == b)]
        span = hi - lo
        ratio = (
            resource_integral_node_s(trace, lo, hi) / (span * len(trace.nodes))
            if span > 0
            else math.nan
        )
        out.append(
            WindowStats(
                start_s=lo,
                end_s=hi,
                events=len(members),
                inc=sum(1 for e in members if e.joined),
                dec=sum(1 for e in members if e.left),
                idle_ratio=ratio,
            )
        )
    return out


def fragment_cdf(lengths_s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fig. 1: sorted lengths, CDF by count, and CDF by node-time (share of idle node-seconds)."""
    x = np.sort(np.asarray(lengths_s, dtype=float))
    if x.size == 0:
        return x, x.copy(), x.copy()
    by_count = np.arange(1, x.size + 1) / x.size
    cum = np.cumsum(x)
    by_time = cum / cum[-1] if cum[-1] > 0 else by_count
    return x, by_count, by_time


PLOT_NAMES = ("fragments_cdf.png", "events_12h.png")


def write_plots(trace: Trace, directory: Path) -> list[Path]:
    """Write ``fragments_cdf.png`` (Fig. 1) and ``events_12h.png`` (Fig. 6) into ``directory``.

    Both are drawn to temporary files, then both renamed: an interrupted run leaves no
    new plot beside an old one of another trace, and no temporary file.
    """
    try:
        written = _draw_plots(trace, directory)
        for p in written:
            os.replace(_partial(p), p)
    finally:
        for name in PLOT_NAMES:
            _partial(directory / name).unlink(missing_ok=True)
    log.info("wrote %s", ", ".join(str(p) for p in written))
    return written


def _draw_plots(trace: Trace, directory: Path) -> list[Path]:
    plt = agg_pyplot()

    directory.mkdir(parents=True, exist_ok=True)
    title = Path(trace.source).name
    written: list[Path] = []

    x, by_count, by_time = fragment_cdf(fragment_lengths_s(trace))
    fig, ax = plt.subplots(figsize=(6, 4))
    if x.size:
        ax.step(x / 60.0, by_count, where="post", label="by count")
        ax.step(x / 60.0, by_time, where="post", label="by node x time")
        ax.set_xscale("log")
    ax.axvline(SHORT_FRAGMENT_S / 60.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("idle fragment length (minutes)")
    ax.set_ylabel("cumulative share")
    ax.set_ylim(0, 1)
    ax.grid(True, alpha=0.3)
    if x.size:  # no curve, no legend (matplotlib warns on an empty one)
        ax.legend(loc="lower right")
    ax.set_title(f"{title}: {x.size} idle fragments")
    fig.tight_layout()
    path = directory / "fragments_cdf.png"
    fig.savefig(_partial(path), dpi=120, format="png")
    plt.close(fig)
    written.append(path)

    windows = window_stats(trace)
    fig, ax = plt.subplots(figsize=(8, 4))
    mid_h = [((w.start_s + w.end_s) / 2 - trace.start_s) / 3600.0 for w in windows]
    width_h = WINDOW_S / 3600.0 * 0.4
    ax.bar(
        [m - width_h / 2 for m in mid_h],
        [w.inc for w in windows],
        width_h,
        label="events with joins",
    )
    ax.bar(
        [m + width_h / 2 for m in mid_h],
        [w.dec for w in windows],
        width_h,
        label="events with leaves",
    )
    ax.set_xlabel("hours since trace start")
    ax.set_ylabel("events per 12 h")
    ax2 = ax.twinx()
    ax2.plot(mid_h, [100.0 * w.idle_ratio for w in windows], "k.-", label="idle %")
    ax2.set_ylabel("idle nodes (%)")
    ax2.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(
        handles,
        [str(h.get_label()) for h in handles],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.15),
        ncol=3,
        fontsize="small",
    )
    ax.set_title(f"{title}: {len(trace.nodes)} nodes, from {format_time(trace.start_s)}")
    fig.tight_layout()
    path = directory / "events_12h.png"
    fig.savefig(_partial(path), dpi=120, format="png")
    plt.close(fig)
    written.append(path)
    return written


def _partial(path: Path) -> Path:
    return path.with_name(f".{path.name}.partial")


def format_summary(summary: TraceSummary, *, load_s: float | None = None) -> Sequence[str]:
    """Human-readable lines: the Table 1 row first, then the fragment figures."""
    s = summary
    lines = [
        f"trace       {s.source} ({s.nodes:,} nodes)",
        f"span        {s.start} -> {s.end}",
        f"duration    {s.duration_h:.1f} h, {s.events:,} events",
        f"INC/h       {s.inc_per_h:.2f}   (events with joins per hour)",
        f"DEC/h       {s.dec_per_h:.2f}   (events with leaves per hour)",
        f"idle ratio  {100 * s.idle_ratio:.2f} %",
        f"eq-nodes    {s.eq_nodes:.1f}   ({s.node_hours:,.0f} node-hours)",
    ]
    if s.fragments:
        lines += [
            f"fragments   {s.fragments:,}: median {s.fragment_median_s / 60:.1f} min, "
            f"mean {s.fragment_mean_s / 60:.1f} min, p90 {s.fragment_p90_s / 60:.1f} min",
            f"short       {100 * s.short_fragment_share:.1f} % of fragments < 10 min, "
            f"holding {100 * s.short_fragment_time_share:.1f} % of their node-time",
        ]
    elif s.idle_ratio > 0:  # idle all along, or from or to the trace's edge only
        lines.append("fragments   0: no node's idle time both starts and ends inside the trace")
    else:  # their figures are undefined (null in --json), not "nan min"
        lines.append("fragments   0: no node was idle")
    for a, b in s.possible_outages[:10]:
        lines.append(
            f"quiet       {format_time(a)} -> {format_time(b)} ({(b - a) / 3600:.1f} h with no "
            "node taken: a possible outage)"
        )
    if len(s.possible_outages) > 10:
        lines.append(f"quiet       ... {len(s.possible_outages) - 10} more (--json lists all)")
    if load_s is not None:
        lines.append(f"load        {load_s:.2f} s")
    return lines
