"""The canonical pool-trace format: a sparse node-event log, its reader and its writers.

A trace is a table with columns ``time,node,idle`` and the optional ``window_s`` and
``event_index``, stored as CSV (``.csv`` or ``.csv.gz``) or Parquet (``.parquet``). Rows are
sorted by time; all rows with one time form one event. The first time lists every node
(``idle`` 1 or 0): the snapshot. Later rows list only the nodes whose state changed. A row
that repeats a node's state changes nothing (the writers use one to mark where a trace ends).

Times may be ``YYYY-mm-dd HH:MM:SS`` (naive means UTC, as in the Summit log), ISO-8601 with
an offset, or epoch seconds. The writers write ISO-8601 UTC with a ``Z`` suffix and, only
when needed, fractional seconds to the microsecond (``2021-02-10T00:08:52Z``).

``window_s`` is the seconds, from the row's time, until the main scheduler takes the node
back; empty means open-ended or unknown. ``event_index`` is informative and not read.

The format is in four modules of one concern each: times (``trace_time``), the model and its
errors (``trace_model``), the reader (``trace_reader``) and the durable live writer
(``trace_writer``). This module keeps the public names in one place and writes a whole
trace to a file (``write_trace``).
"""

from __future__ import annotations

import csv
import gzip
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bftrainer.idle_monitor.trace_model import (
    REQUIRED_COLUMNS,
    WRITER_COLUMNS,
    Trace,
    TraceFormatError,
    TraceRangeError,
)
from bftrainer.idle_monitor.trace_reader import load_trace
from bftrainer.idle_monitor.trace_time import (
    EPOCH_MAX_S,
    EPOCH_MIN_S,
    check_epoch_s,
    format_time,
    parse_time_s,
    quantize_time_s,
)
from bftrainer.idle_monitor.trace_writer import TraceInUseError, TraceWriter, rows_for

__all__ = [
    "EPOCH_MAX_S",
    "EPOCH_MIN_S",
    "REQUIRED_COLUMNS",
    "WRITER_COLUMNS",
    "Trace",
    "TraceFormatError",
    "TraceInUseError",
    "TraceRangeError",
    "TraceWriter",
    "check_epoch_s",
    "check_trace_out",
    "format_time",
    "load_trace",
    "parse_time_s",
    "quantize_time_s",
    "trace_rows",
    "write_trace",
]


def trace_rows(trace: Trace) -> Iterator[tuple[str, str, str, str]]:
    """The canonical rows ``(time, node, idle, window_s)`` of a trace, snapshot first.

    When the last event is before ``end_s``, a final row restates one node's state at
    ``end_s`` so that the file keeps the trace's full duration.
    """
    start_text = format_time(trace.start_s)
    snapshot = ((n, n in trace.initial_idle) for n in trace.nodes)
    yield from rows_for(start_text, snapshot, trace.initial_windows_s)
    idle = set(trace.initial_idle)
    last_s = trace.start_s
    for event in trace.events:
        text = format_time(event.time_s)
        changes = [(n, True) for n in sorted(event.joined)]
        changes += [(n, False) for n in sorted(event.left)]
        updated = sorted(set(event.windows_s) - event.joined - event.left)
        changes += [(n, True) for n in updated if n in idle]
        idle |= event.joined
        idle -= event.left
        yield from rows_for(text, changes, event.windows_s)
        last_s = event.time_s
    if trace.end_s > last_s and trace.nodes:
        node = trace.nodes[0]
        yield format_time(trace.end_s), node, "1" if node in idle else "0", ""


def check_trace_out(path: Path) -> None:
    """Refuse, before any work, a trace file that cannot or must not be written: the
    rename that finishes a write would replace a symlink, device, FIFO or folder at
    ``path`` with a regular file; Parquet needs pyarrow; the folder must be writable."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        kind = "a symlink" if path.is_symlink() else "not a regular file"
        raise TraceFormatError(f"{path}: is {kind}; a trace is only written over a regular file")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise TraceFormatError(f"{path}: {folder} is not a writable folder")
    if path.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise TraceFormatError(
                f"{path}: writing Parquet needs pyarrow (pip install pyarrow), or use .csv.gz"
            ) from None


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> int:
    """Write a whole trace in the canonical format; the suffix picks the container.

    ``.parquet`` writes Parquet (needs pyarrow), ``.gz`` gzip-compressed CSV, anything else
    CSV. The ``window_s`` column is written only when the trace knows some window. Returns
    the number of rows. For recording live, use ``TraceWriter``.

    Written to a temporary file beside ``path`` and renamed over it when complete, so an
    interrupted write never leaves a cut-off trace (or half of an earlier one's rewrite).
    """
    final = Path(path)
    check_trace_out(final)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.partial{final.suffix}")
    try:
        count = _write_trace_to(trace, tmp, final)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return count


def _write_trace_to(trace: Trace, out: Path, final: Path) -> int:
    """``write_trace`` into ``out``, in the format ``final``'s suffix names."""
    rows = list(trace_rows(trace))
    with_windows = _has_windows(trace)
    if final.suffix == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:  # pragma: no cover - pyarrow is an optional dependency
            raise TraceFormatError(f"{final}: writing Parquet needs pyarrow") from exc
        columns = list(zip(*rows, strict=True)) if rows else [(), (), (), ()]
        data = {
            "time": pa.array(columns[0], pa.string()),
            "node": pa.array(columns[1], pa.string()),
            "idle": pa.array([int(v) for v in columns[2]], pa.int8()),
        }
        if with_windows:
            data["window_s"] = pa.array([float(v) if v else None for v in columns[3]], pa.float64())
        pq.write_table(pa.table(data), out)
        return len(rows)
    width = len(WRITER_COLUMNS) if with_windows else len(REQUIRED_COLUMNS)
    opener: Any = gzip.open if final.suffix == ".gz" else open
    with opener(out, "wt", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(WRITER_COLUMNS[:width])
        writer.writerows(row[:width] for row in rows)
    return len(rows)


def _has_windows(trace: Trace) -> bool:
    """Whether any window is known; without one, ``write_trace`` leaves the column out."""
    if any(w is not None for w in trace.initial_windows_s.values()):
        return True
    return any(w is not None for e in trace.events for w in e.windows_s.values())
