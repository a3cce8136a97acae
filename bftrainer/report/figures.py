"""The report's figures, drawn from the frames (matplotlib's Agg, no display needed).

Each function returns a ``Figure`` (None when there is nothing to draw). Trainers beyond
the ``top`` with the most node-hours are grouped, so a week of 1,000 trainers stays
readable; the page says so. Times are UTC on every axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib import dates as mdates
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, MaxNLocator

from bftrainer.report.frames import Frames
from bftrainer.report.series import (
    Grid,
    binned_mean,
    seconds,
    total_allocated,
    trainer_steps,
)

OTHER_COLOUR = "#c8c8c8"
# tab10 without its grey, then tab20's light shades without theirs, and two of tab20b.
PALETTE = (
    *("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"),
    *("#bcbd22", "#17becf", "#393b79", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896"),
    *("#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#637939"),
)
POOL_COLOUR = "#000000"
# How each change of a trainer's nodes is marked on the Gantt chart.
MARKS = {
    "start": dict(marker=">", color="#1a9850", s=36, label="start"),
    "rescale": dict(marker="|", color="#404040", s=30, label="rescale (tick above)"),
    "preempt": dict(marker="|", color="#d73027", s=30, label="preemption (tick below)"),
    "complete": dict(marker="o", color="#000000", s=30, label="completion"),
    "cancel": dict(marker="s", color="#7f7f7f", s=30, label="cancellation"),
    "fail": dict(marker="X", color="#762a83", s=40, label="failure"),
}
# Rescales and preemptions are many: ticks above and below a row's bar, not on it.
MARK_OFFSET = {"rescale": -0.4, "preempt": 0.4}
FONT = 10
WIDTH_IN = 10.0
LEGEND_IN = 2.3  # room on the right for the legends


@dataclass(frozen=True)
class View:
    """What every figure of one run shares: its span and bins; the zoom (the whole span
    when short) where the trainers are drawn one by one; the trainers drawn on their
    own there (``top``, most node-hours first) with their colours; how many others held
    nodes in the zoom."""

    start: pd.Timestamp
    end: pd.Timestamp
    grid: Grid
    zoom: tuple[pd.Timestamp, pd.Timestamp]
    top: tuple[str, ...]
    colours: dict[str, str]
    others: int

    @property
    def zoomed(self) -> bool:
        return self.zoom != (self.start, self.end)


def colours_for(trainers: Sequence[str]) -> dict[str, str]:
    """Distinct qualitative colours, none grey (grey is the grouped 'other trainers')."""
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(trainers)}


def panels(
    height_in: float, rows: int = 1, left_in: float = 0.8, ratios: Sequence[float] | None = None
) -> tuple[Figure, list[Axes]]:
    """A 10-inch-wide figure with fixed margins (the right one for the legends): laid
    out by hand, as matplotlib's automatic layouts draw every figure twice."""
    fig = Figure(figsize=(WIDTH_IN, height_in))
    fig.subplots_adjust(
        left=left_in / WIDTH_IN,
        right=1 - LEGEND_IN / WIDTH_IN,
        bottom=0.6 / height_in,
        top=1 - 0.35 / height_in,
        hspace=1.2 / height_in * rows,
    )
    axes = fig.subplots(rows, 1, squeeze=False, height_ratios=ratios)[:, 0]
    return fig, list(axes)


def _figure(height_in: float, left_in: float = 0.8) -> tuple[Figure, Axes]:
    fig, (ax,) = panels(height_in, left_in=left_in)
    return fig, ax


def _time_axis(ax: Axes, view: View, span: tuple[pd.Timestamp, pd.Timestamp] | None = None) -> None:
    """A UTC date axis over the view's span (or ``span``)."""
    time_axis(ax, *(span if span is not None else (view.start, view.end)))


def time_axis(ax: Axes, lo: pd.Timestamp, hi: pd.Timestamp) -> None:
    """A UTC date axis from ``lo`` to ``hi``."""
    locator = mdates.AutoDateLocator(minticks=4, maxticks=10)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.set_xlim(
        float(mdates.date2num(plot_times([lo])[0])), float(mdates.date2num(plot_times([hi])[0]))
    )
    ax.set_xlabel("time (UTC)", fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax.grid(alpha=0.3)


def plot_times(times: Sequence[pd.Timestamp] | pd.Series | pd.DatetimeIndex) -> np.ndarray:
    """UTC datetimes as naive datetime64 for matplotlib's date axis."""
    return pd.DatetimeIndex(times).tz_convert(None).to_numpy()


def pool_split(f: Frames, view: View, whole: bool) -> Figure:
    """The pool's size and the nodes given to trainers: over the whole span, all
    trainers as one area (``whole``); over the zoom, each top trainer's nodes stacked."""
    fig, ax = _figure(4.2)
    grid = view.grid if whole else Grid.over(*view.zoom)
    x = plot_times(grid.times)
    pool = binned_mean(seconds(f.pool["time"]), f.pool["nodes"].to_numpy(float), grid)
    total = binned_mean(*total_allocated(f.allocations), grid) if len(f.allocations) else 0 * pool
    low = np.zeros_like(pool)
    for t in () if whole else view.top:
        high = low + binned_mean(*trainer_steps(f.allocations, t), grid)
        ax.fill_between(x, _post(low), _post(high), step="post", color=view.colours[t], label=t)
        low = high
    rest = np.maximum(total, low)
    others = view.others if not whole else f.allocations["trainer"].nunique()
    if others:
        label = f"{'other ' if view.top and not whole else 'all '}trainers ({others:,})"
        ax.fill_between(x, _post(low), _post(rest), step="post", color=OTHER_COLOUR, label=label)
    ax.step(x, _post(pool), where="post", color=POOL_COLOUR, lw=1.2, label="idle pool")
    if whole and view.zoomed:
        ax.axvspan(
            *plot_times(list(view.zoom)), color="#4575b4", alpha=0.12, lw=0, label="zoom below"
        )
    ax.set_ylabel("nodes", fontsize=FONT)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, max(1.0, float(pool.max()) * 1.08))
    what = "the nodes given to trainers" if whole else "each trainer's nodes"
    ax.set_title(
        f"Idle pool and {what} (mean over {duration(grid.width_s)} bins)", fontsize=FONT + 1
    )
    _time_axis(ax, view, None if whole else view.zoom)
    ax.legend(fontsize=FONT - 1, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


def gantt(f: Frames, view: View) -> Figure | None:
    """Each top trainer's nodes over the zoom, one row each, with its changes marked."""
    if not view.top:
        return None
    a = f.allocations[f.allocations["trainer"].isin(view.top)]
    first = a.groupby("trainer")["time"].min()
    rows = sorted(view.top, key=lambda t: (first[t], t))  # a Gantt chart: by start
    peaks = a.groupby("trainer")["nodes"].max()
    fig, ax = _figure(max(2.6, 1.2 + 0.32 * len(rows)), left_in=1.9)  # the legend's room
    end_s = view.end.timestamp()
    for i, t in enumerate(rows):
        times_s, nodes = trainer_steps(a, t)
        xs = np.append(times_s, max(end_s, times_s[-1]))
        half = 0.32 * _post(nodes) / max(1, peaks[t])  # each row to its own peak
        x = plot_times(pd.to_datetime(xs, unit="s", utc=True))
        ax.fill_between(x, i - half, i + half, step="post", color=view.colours[t], lw=0)
    row_of = {t: i for i, t in enumerate(rows)}
    for change, style in MARKS.items():
        hit = a[a["change"] == change]
        if len(hit):
            y = hit["trainer"].map(row_of).to_numpy(float) + MARK_OFFSET.get(change, 0.0)
            ax.scatter(plot_times(hit["time"]), y, zorder=3, linewidths=1.2, **style)  # type: ignore[arg-type]
    ax.set_yticks(range(len(rows)), [f"{t} (max {peaks[t]})" for t in rows], fontsize=FONT - 1)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_ylabel("trainer", fontsize=FONT)
    ax.set_title(
        f"Nodes of the {len(rows)} trainers with the most node-hours "
        "(bar height: nodes, full at each one's max)",
        fontsize=FONT + 1,
    )
    _time_axis(ax, view, view.zoom)
    ax.legend(fontsize=FONT - 1, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


def utilization(f: Frames, view: View, window_s: float) -> Figure:
    """The share of the pool's node-hours given to trainers per window and, for a
    replay, U per window with the clairvoyant limit U_max."""
    fig, ax = _figure(3.6)
    grid = Grid.windows(view.start, view.end, window_s)
    pool = binned_mean(seconds(f.pool["time"]), f.pool["nodes"].to_numpy(float), grid)
    given = binned_mean(*total_allocated(f.allocations), grid) if len(f.allocations) else 0 * pool
    share = np.divide(100 * given, pool, out=np.full_like(pool, np.nan), where=pool > 0)
    x = plot_times(grid.times)
    ax.step(
        x,
        _post(share),
        where="post",
        color="#4575b4",
        lw=2.5,
        zorder=3,  # above the limit's dashes where both are near 100%
        label="harvested share of the pool's node-hours",
    )
    if f.source == "replay" and len(f.windows):
        u = 100 * f.windows["utilization_efficiency"].to_numpy(float)
        wx = plot_times(pd.concat([f.windows["start"], pd.Series([view.end])], ignore_index=True))
        ax.step(
            wx,
            np.append(u, u[-1]),
            where="post",
            color="#d73027",
            lw=1.5,
            label="U per window (A_e / A_s)",
        )
        limit = f.summary.get("utilization_limit")
        if isinstance(limit, int | float):
            ax.axhline(
                100 * limit,
                color="#000000",
                ls="--",
                lw=1.2,
                label=f"limit U_max, whole replay ({100 * limit:.1f}%)",
            )
    ax.set_ylim(0, 105)
    ax.set_ylabel(f"% per {duration(window_s)} window", fontsize=FONT)
    ax.set_title("What the trainers made of the idle nodes", fontsize=FONT + 1)
    _time_axis(ax, view)
    ax.legend(fontsize=FONT - 1, loc="lower left")
    return fig


def costs(f: Frames, view: View, window_s: float) -> Figure:
    """Rescales and preemptions per window and, for a replay, the samples they cost."""
    count = 2 if f.source == "replay" else 1
    fig, axes = panels(2.6 * count + 0.6, rows=count, left_in=0.9)
    grid = Grid.windows(view.start, view.end, window_s)
    x = plot_times(grid.times)
    ax = axes[0]
    width = np.diff(x)
    for offset, (change, label, colour) in enumerate(
        [("rescale", "rescales", "#404040"), ("preempt", "preemptions", "#d73027")]
    ):
        times = seconds(f.allocations.loc[f.allocations["change"] == change, "time"])
        counts, _ = np.histogram(times, grid.edges_s)
        ax.bar(
            x[:-1] + width * offset / 2,
            counts,
            width=width / 2,
            align="edge",
            color=colour,
            label=label,
        )
    ax.set_ylabel(f"count per {duration(window_s)} window", fontsize=FONT)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Rescales and preemptions", fontsize=FONT + 1)
    ax.legend(fontsize=FONT - 1, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    _time_axis(ax, view)
    if count == 2:
        ax2 = axes[1]
        ev = f.events
        for col, label, colour in [
            ("rescale_cost_samples", "rescale cost", "#404040"),
            ("preemption_cost_samples", "preemption cost", "#d73027"),
        ]:
            ax2.step(
                plot_times(ev["time"]), ev[col].cumsum(), where="post", color=colour, label=label
            )
        ax2.set_ylabel("samples lost, cumulative", fontsize=FONT)
        ax2.yaxis.set_major_formatter(EngFormatter())
        ax2.legend(fontsize=FONT - 1, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        _time_axis(ax2, view)
        ax.set_xlabel("")
        ax.tick_params(labelbottom=False)
    return fig


def latency(f: Frames, view: View) -> Figure | None:
    """Each decision's latency (inputs seen -> node sets handed over), log scale."""
    if "latency_s" not in f.events:
        return None
    d = f.events[f.events["decided"]]
    if d.empty:
        return None
    ms = d["latency_s"].to_numpy(float) * 1e3
    fig, ax = _figure(3.2)
    ax.scatter(
        plot_times(d["time"]),
        np.maximum(ms, 1e-3),
        s=4,
        alpha=0.4,
        color="#4575b4",
        lw=0,
        label="a decision",
    )
    for q, ls in ((0.5, "-"), (0.95, "--")):
        v = float(np.quantile(ms, q))
        ax.axhline(
            max(v, 1e-3), color="#000000", ls=ls, lw=1, label=f"p{round(100 * q)}: {v:.1f} ms"
        )
    ax.set_yscale("log")
    ax.set_ylabel("decision latency (ms)", fontsize=FONT)
    ax.set_title(f"Decision latency ({len(d):,} decisions)", fontsize=FONT + 1)
    _time_axis(ax, view)
    ax.legend(fontsize=FONT - 1, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


def holders(f: Frames, view: View) -> Figure | None:
    """The daemon's holder jobs: pending and running over time, main-job preemptions of
    held nodes, and why the ended ones ended."""
    h = f.holders
    if h.empty:
        return None
    fig, (top, bottom) = panels(5.8, rows=2, left_in=1.9, ratios=[3, 2])
    grid = view.grid
    x = plot_times(grid.times)
    started = h["started"].fillna(h["ended"]).fillna(view.end)
    ended = h["ended"].fillna(view.end + pd.Timedelta(seconds=1))
    for label, begin, stop, colour in [
        ("pending", h["submitted"], started, "#fdae61"),
        ("running (holding a node)", h["started"].dropna(), ended[h["started"].notna()], "#4575b4"),
    ]:
        times = pd.concat([begin, stop], ignore_index=True)
        delta = np.concatenate([np.ones(len(begin)), -np.ones(len(stop))])
        order = np.argsort(seconds(times), kind="stable")
        count = np.cumsum(delta[order])
        mean = binned_mean(seconds(times)[order], count, grid)
        top.step(x, _post(mean), where="post", color=colour, lw=1.5, label=label)
    pre = h[h["reason"] == "preempted"]
    if len(pre):
        top.scatter(
            plot_times(pre["ended"]),
            np.zeros(len(pre)),
            marker="|",
            s=200,
            color="#d73027",
            label=f"taken by a main job ({len(pre)})",
            zorder=3,
        )
    top.set_ylabel("holder jobs", fontsize=FONT)
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    top.set_title(
        "Holder jobs (mean over bins) and main-job preemptions of held nodes", fontsize=FONT + 1
    )
    _time_axis(top, view)
    top.legend(fontsize=FONT - 1, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    reasons = h.loc[h["state"] == "ended", "reason"].replace("", "(none given)").value_counts()
    if len(reasons):
        bottom.barh(reasons.index.astype(str), reasons.to_numpy(), color="#7f7f7f")
        bottom.invert_yaxis()
    else:
        bottom.set_yticks([])
        bottom.text(0.5, 0.5, "no holder job has ended", ha="center", va="center", fontsize=FONT)
    bottom.set_xlabel("holder jobs ended", fontsize=FONT)
    bottom.set_title("Why the ended holders ended", fontsize=FONT + 1)
    bottom.tick_params(labelsize=FONT)
    return fig


def _post(values: np.ndarray) -> np.ndarray:
    """Bin values for ``step="post"`` over the bins' n + 1 edges: the last repeated."""
    return np.append(values, values[-1]) if len(values) else values


def duration(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.3g} h"
    if s >= 60:
        return f"{s / 60:.3g} min"
    return f"{s:.3g} s"
