"""The report's table of each trainer's curve: which points are measured, which prior.

A daemon plans on what each trainer measured and a prior elsewhere (docs/allocator.md,
"Curves nobody gives"); the table says, per trainer, which counts it had measured by
the report's end and the rates there, and how many of the curve's points were prior,
as ``bftrainer status`` labels them.
"""

from __future__ import annotations

import html

from bftrainer.report.frames import Frames
from bftrainer.trainers.learned_curve import MEASURED

TITLE = "Curves the allocator planned on"


def curves_table(f: Frames) -> str:
    """The table's HTML; empty when no trainer had measured anything (or for a replay,
    whose outputs keep no curves)."""
    if f.curves.empty:
        return ""
    rows = []
    for tid, points in f.curves.groupby("trainer", sort=False):
        measured = points[points["source"] == MEASURED]
        prior = points[points["source"] != MEASURED]
        rates = ", ".join(
            f"{n}: {v:,.1f}"
            for n, v in zip(measured["nodes"], measured["throughput_sps"], strict=True)
        )
        cells = (str(tid), rates or "none", ", ".join(str(n) for n in prior["nodes"]) or "none")
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return (
        f"<h3>{TITLE}</h3><p>Each trainer's throughput curve at the end: the node counts it "
        "had measured (samples/s there) and the breakpoints that were prior (docs/"
        "allocator.md). Trainers that had measured nothing are not listed.</p>"
        "<table><thead><tr><th>trainer</th><th>measured (nodes: samples/s)</th>"
        "<th>prior (nodes)</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )
