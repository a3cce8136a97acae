"""The page's opening when a replay ran several policies: them side by side.

A centre's manager asks which policy to run; each policy's own section answers what it
did, not how it compares. One figure puts every run's cumulative samples processed and
its U per window on the same time axis (one colour per run in both panels, the same
colour as its column of the table under it). Both are read from each run's
``windows.csv``, the replay's own per-window figures, so the figure and the table agree
with ``summary.json``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

from bftrainer.report.figures import FONT, PALETTE, duration, panels, plot_times, time_axis
from bftrainer.report.frames import Frames
from bftrainer.report.headline import span

NAME = "compare.png"


def caption(runs: Sequence[Frames]) -> str:
    names = ", ".join(f.label for f in runs)
    return f"The policies side by side, one line each ({names}): samples processed and U."


def compared(runs: Sequence[Frames]) -> bool:
    """Whether the page opens with the comparison: several replay runs, some with
    windows (a daemon's page, or one run's, has nothing to compare)."""
    return (
        len(runs) > 1
        and all(f.source == "replay" for f in runs)
        and any(len(f.windows) for f in runs)
    )


def run_colours(runs: Sequence[Frames]) -> dict[str, str]:
    """Each run's colour, in the figure and the table alike."""
    return {f.label: PALETTE[i % len(PALETTE)] for i, f in enumerate(runs)}


def window_ends(f: Frames) -> tuple[pd.Series, pd.Series]:
    """Each window's start and end (the last one cut at the replay's end)."""
    start = f.windows["start"]
    return start, start + pd.to_timedelta(f.windows["hours"].astype(float), unit="h")


def comparison(runs: Sequence[Frames]) -> Figure:
    """Cumulative samples processed at each window's end (top) and U per window
    (bottom), one line per run. A run drawn later is drawn thinner, so runs with the
    same figures (their lines on top of each other) all stay visible."""
    fig, (top, bottom) = panels(6.0, rows=2, left_in=0.95)
    fig.subplots_adjust(hspace=0.22)  # one time axis: no tick labels between the panels
    colours = run_colours(runs)
    spans = [span(f) for f in runs]
    lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
    widths: set[float] = set()
    for i, f in enumerate(runs):
        if f.windows.empty:
            continue
        lw = 1.4 + 1.6 * (len(runs) - 1 - i) / max(1, len(runs) - 1)
        starts, ends = window_ends(f)
        widths.add(round(float(f.windows["hours"].iloc[0]) * 3600))
        samples = np.concatenate([[0.0], f.windows["samples_processed"].cumsum().to_numpy(float)])
        x = plot_times(pd.concat([starts.iloc[:1], ends], ignore_index=True))
        top.plot(x, samples, color=colours[f.label], lw=lw, marker="o", ms=3, label=f.label)
        u = 100 * f.windows["utilization_efficiency"].to_numpy(float)
        wx = plot_times(pd.concat([starts, ends.iloc[-1:]], ignore_index=True))
        bottom.step(
            wx, np.append(u, u[-1]), where="post", color=colours[f.label], lw=lw, label=f.label
        )
    per = " / ".join(duration(w) for w in sorted(widths)) or "-"
    top.set_ylabel("samples processed,\ncumulative", fontsize=FONT)
    top.yaxis.set_major_formatter(EngFormatter())
    top.set_ylim(bottom=0)
    top.set_title(f"Samples processed, at each window's end ({per} windows)", fontsize=FONT + 1)
    bottom.set_ylim(0, 105)
    bottom.set_ylabel(f"U (A_e / A_s), %\nper {per} window", fontsize=FONT)
    bottom.set_title("U per window", fontsize=FONT + 1)
    for ax in (top, bottom):
        time_axis(ax, lo, hi)
        ax.legend(fontsize=FONT - 1, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    top.set_xlabel("")
    top.tick_params(labelbottom=False)
    return fig
