"""Write the report: each figure as a PNG, and one HTML page with the PNGs inlined.

The page is a single file a centre can mail or archive: no script, no external link;
each image is a base64 ``data:`` URL of the PNG written beside it.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from bftrainer import __version__
from bftrainer.report import compare, figures
from bftrainer.report.curves import curves_table
from bftrainer.report.figures import View, colours_for
from bftrainer.report.frames import Frames
from bftrainer.report.headline import headline, span
from bftrainer.report.series import Grid, busiest, node_seconds, total_allocated

PAGE = "report.html"
# Trainers are drawn one by one over at most this long (see view_of).
ZOOM_S = 6 * 3600.0
DPI = 100


@dataclass(frozen=True)
class Image:
    name: str  # the PNG's file name
    caption: str
    png: bytes


def window_s(f: Frames, start: pd.Timestamp, end: pd.Timestamp) -> float:
    """Windows of per-window figures: a replay's own (its U per window), else an hour up
    to two days and 6 h beyond."""
    hours = f.summary.get("window_hours")
    if isinstance(hours, int | float) and hours > 0:
        return float(hours) * 3600
    return 3600.0 if (end - start).total_seconds() <= 2 * 86400 else 6 * 3600.0


def view_of(f: Frames, top: int) -> View:
    """The span, and the zoom where trainers are drawn one by one: the whole span up to
    ``2 * ZOOM_S``, else the ``ZOOM_S`` in which the trainers held the most node-hours
    (over a week, 1,000 trainers of an hour each are specks)."""
    start, end = span(f)
    grid = Grid.over(start, end)
    zoom = (start, end)
    if (end - start).total_seconds() > 2 * ZOOM_S and len(f.allocations):
        lo = busiest(*total_allocated(f.allocations), grid, ZOOM_S)
        z0 = pd.Timestamp(lo, unit="s", tz="UTC")
        zoom = (z0, min(end, z0 + pd.Timedelta(seconds=ZOOM_S)))
    held = node_seconds(f.allocations, *zoom) if len(f.allocations) else pd.Series(dtype=float)
    chosen = tuple(str(t) for t in held.index[:top])
    return View(start, end, grid, zoom, chosen, colours_for(chosen), len(held) - len(chosen))


def run_images(f: Frames, top: int, prefix: str) -> tuple[View, list[Image]]:
    view = view_of(f, top)
    w = window_s(f, view.start, view.end)
    if view.zoomed:  # the whole span, all trainers as one; the zoom, split
        pools = [
            (
                "pool",
                "The idle pool and the nodes given to trainers.",
                figures.pool_split(f, view, True),
            ),
            (
                "pool-zoom",
                "The idle pool and each trainer's nodes, in the zoom.",
                figures.pool_split(f, view, False),
            ),
        ]
    else:  # the whole span is the zoom
        pools = [
            ("pool", "The idle pool and each trainer's nodes.", figures.pool_split(f, view, False))
        ]
    zoom = ", in the zoom" if view.zoomed else ""
    drawn: list[tuple[str, str, Figure | None]] = [
        *pools,
        ("trainers", f"Each trainer's nodes, with its changes{zoom}.", figures.gantt(f, view)),
        (
            "utilization",
            "What the trainers made of the idle nodes.",
            figures.utilization(f, view, w),
        ),
        ("costs", "Rescales and preemptions.", figures.costs(f, view, w)),
        ("latency", "How long each decision took.", figures.latency(f, view)),
        ("holders", "The daemon's holder jobs.", figures.holders(f, view)),
    ]
    return view, [Image(f"{prefix}{name}.png", cap, _png(fig)) for name, cap, fig in drawn if fig]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def write_report(runs: Sequence[Frames], out_dir: Path, top: int, title: str) -> Path:
    """The PNGs and ``report.html`` into ``out_dir`` (which exists); the page's path.
    Several replay runs open with them side by side (compare.py), then each run's
    section; one run, or a daemon, opens with its table alone."""
    sections = []
    for f in runs:
        prefix = f"{f.label}-" if len(runs) > 1 else ""
        view, images = run_images(f, top, prefix)
        for im in images:
            (out_dir / im.name).write_bytes(im.png)
        sections.append(_section(f, view, images, len(runs) > 1))
    body = "\n".join(
        [
            f"<h1>{html.escape(title)}</h1>",
            *_opening(runs, out_dir),
            *_notes(runs),
            *sections,
            f"<footer>bftrainer {__version__}</footer>",
        ]
    )
    page = out_dir / PAGE
    page.write_text(_HTML.format(title=html.escape(title), body=body))
    return page


def _opening(runs: Sequence[Frames], out_dir: Path) -> list[str]:
    """The headline table; for several replay runs, first the figure that compares them,
    each run in the colour of its column."""
    if not compare.compared(runs):
        return [_table(headline(runs))]
    im = Image(compare.NAME, compare.caption(runs), _png(compare.comparison(runs)))
    (out_dir / im.name).write_bytes(im.png)
    names = ", ".join(f.label for f in runs)
    return [
        '<section id="comparison">',
        "<h2>The policies side by side</h2>",
        f"<p>{len(runs)} runs of one replay: {html.escape(names)}. Each policy's own "
        "figures follow, in a section each.</p>",
        _figure(im),
        _table(headline(runs), compare.run_colours(runs)),
        "</section>",
    ]


def _table(rows: Sequence[tuple[str, list[str]]], colours: dict[str, str] | None = None) -> str:
    """Rows of (name, one cell per run); with ``colours``, each run's colour keys its
    column's head to the comparison figure."""
    head, *rest = rows
    keys = [
        f'<span class="key" style="background:{colours[c]}"></span>'
        if colours and c in colours
        else ""
        for c in head[1]
    ]
    cells = "".join(f"<th>{k}{html.escape(c)}</th>" for k, c in zip(keys, head[1], strict=True))
    out = [f"<table><thead><tr><th></th>{cells}</tr></thead><tbody>"]
    for name, values in rest:
        tds = "".join(f"<td>{html.escape(v)}</td>" for v in values)
        out.append(f"<tr><th>{html.escape(name)}</th>{tds}</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _notes(runs: Sequence[Frames]) -> list[str]:
    notes = []
    if any(f.source == "replay" for f in runs):
        notes.append(
            "<p>U is what the trainers processed over what the same node-hours would give "
            "as dedicated nodes; the limit U_max is a clairvoyant policy's U (the best "
            "split of the pool at every instant, no rescale cost). See docs/replay.md.</p>"
        )
    if any(f.source == "daemon" for f in runs):
        notes.append(
            "<p>The daemon's store does not record decision latency (its log does, at "
            "INFO); a daemon's rescales and preemptions are read from its allocation "
            "history: a decrease whose nodes had just left the pool is a preemption.</p>"
        )
    return notes


def _section(f: Frames, view: View, images: Sequence[Image], titled: bool) -> str:
    start, end = (_time(t) for t in (view.start, view.end))
    drawn = len(view.top) + view.others
    where = ""
    if view.zoomed:
        hours = (view.zoom[1] - view.zoom[0]).total_seconds() / 3600
        where = (
            f"Trainers are drawn one by one in a zoom: the {hours:g} h in which they held "
            f"the most node-hours, from {_time(view.zoom[0])} to {_time(view.zoom[1])}. "
        )
    if view.others:
        grouping = (
            f"The {len(view.top)} trainers with the most node-hours are drawn on their own; "
            f"the other {view.others:,} of the {drawn:,} that held nodes are grouped as "
            "'other trainers'."
        )
    else:
        grouping = f"All {drawn:,} trainers that held nodes are drawn on their own."
    grouping = where + grouping
    parts = [f"<h2>{html.escape(f.label)}</h2>" if titled else ""]
    parts.append(f"<p>From {start} to {end}. {html.escape(grouping)}</p>")
    parts.extend(_figure(im) for im in images)
    parts.append(curves_table(f))
    return "\n".join(parts)


def _figure(im: Image) -> str:
    data = base64.b64encode(im.png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(im.caption)}">'
        f"<figcaption>{html.escape(im.caption)} ({html.escape(im.name)})</figcaption></figure>"
    )


def _time(t: pd.Timestamp) -> str:
    return t.strftime("%Y-%m-%d %H:%M UTC")


_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; max-width: 1040px; margin: 1em auto; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ padding: 0.25em 0.8em; border-bottom: 1px solid #ddd; text-align: right; }}
tbody th {{ text-align: left; font-weight: normal; }}
figure {{ margin: 1.5em 0; }}
img {{ max-width: 100%; }}
figcaption, footer {{ color: #555; font-size: 0.9em; }}
.key {{ display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.35em; }}
</style></head>
<body>
{body}
</body></html>
"""
