"""Reading pool traces: CSV, CSV.gz or Parquet into a checked ``Trace``.

Rows are sorted by time; all rows with one time form one event. The first time lists every
node (``idle`` 1 or 0): the snapshot. Later rows list only the nodes whose state changed. A
row that repeats a node's state changes nothing. ``window_s`` is the seconds, from the row's
time, until the main scheduler takes the node back; empty means open-ended or unknown.
``event_index`` is informative and not read.
"""

from __future__ import annotations

import csv
import gzip
import logging
import math
import os
import stat
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bftrainer.common.names import repeated_column
from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.text_lines import line_not_text
from bftrainer.idle_monitor.trace_model import REQUIRED_COLUMNS, Trace, TraceFormatError
from bftrainer.idle_monitor.trace_time import format_time, parse_time_s

log = logging.getLogger(__name__)

_IDLE_VALUES = {"1": True, "0": False}
_GZIP_MAGIC = b"\x1f\x8b"
_PARQUET_MAGIC = b"PAR1"


def node_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a trace's node, or ``None``: a control character (a NUL, a
    newline) makes another node of the same host. One check, for the traces read here
    and for the node names of a job log (``joblog_model.node_names``), so that no trace
    ``trace from-log`` writes is refused when it is read back."""
    if not name.isprintable():
        return "is not a printable name"
    return None


def load_trace(
    path: str | os.PathLike[str],
    *,
    nodes: slice | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    strict: bool = False,
) -> Trace:
    """Read a trace file (CSV, CSV.gz or Parquet, told apart by content) and slice it.

    A node first listed after the snapshot was busy before that row: recorders add nodes
    that appear later. ``strict=True`` rejects such a node instead, which catches a file
    whose snapshot was cut. Raises ``TraceFormatError`` naming file, line and value.
    """
    header, trace = _read(Path(path), strict=strict)
    if trace is None:
        raise TraceFormatError(f"{path}: empty trace (a header '{','.join(header)}' but no rows)")
    if nodes is None and start_s is None and end_s is None:
        return trace
    return trace.slice(nodes=nodes, start_s=start_s, end_s=end_s)


def _read(path: Path, *, strict: bool) -> tuple[list[str], Trace | None]:
    try:
        # A FIFO would block the open (or never end), a device never ends: refused
        # from stat alone, before any open.
        if not stat.S_ISREG(path.stat().st_mode):
            raise TraceFormatError(f"{path}: not a regular file (a FIFO, device or folder)")
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read trace: {exc.strerror or exc}") from exc
    if not magic:
        raise TraceFormatError(f"{path}: empty file (no header)")
    if magic == _PARQUET_MAGIC:
        header, rows = _parquet_rows(path)
        return header, parse_rows(path, header, rows, strict=strict, line_word="row")
    gz = magic.startswith(_GZIP_MAGIC)
    opener: Any = gzip.open if gz else open
    try:
        with opener(path, "rt", newline="", encoding="utf-8") as text:
            reader = csv.reader(text)
            first = next(reader, None)
            if first is None:
                raise TraceFormatError(f"{path}: empty file (no header)")
            return first, parse_rows(path, first, reader, strict=strict, line_word="line")
    except UnicodeDecodeError as exc:
        line = line_not_text(path, gz)
        if line is None:
            raise TraceFormatError(f"{path}: cannot read trace: {exc}") from exc
        raise TraceFormatError(f"{path}:{line}: not text (bytes that are not UTF-8)") from None
    except (OSError, EOFError, csv.Error, zlib.error) as exc:
        # zlib.error: a corrupt gzip stream (gzip raises BadGzipFile, an OSError, only
        # for a bad header).
        raise TraceFormatError(f"{path}: cannot read trace: {exc}") from exc


def _parquet_rows(path: Path) -> tuple[list[str], Iterator[list[str]]]:
    """Parquet columns as CSV-like string rows, so one parser checks both formats."""
    try:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        import pyarrow.types as pat
    except ImportError as exc:  # pragma: no cover - pyarrow is an optional dependency
        raise TraceFormatError(
            f"{path}: reading Parquet needs pyarrow (pip install pyarrow)"
        ) from exc
    import pyarrow as pa

    try:
        table = pq.read_table(path)
        header = list(table.column_names)
        columns: list[list[str]] = []
        for name in header:
            col = table.column(name)
            if name == "time" and pat.is_timestamp(col.type):
                col = pc.divide(pc.cast(pc.cast(col, "timestamp[us, tz=UTC]"), "int64"), 1e6)
            elif pat.is_boolean(col.type):
                col = pc.cast(col, "int8")
            values = col.to_pylist()
            columns.append(["" if v is None else str(v) for v in values])
    except (pa.ArrowException, OSError, ValueError) as exc:
        # A truncated or damaged file: pyarrow says what, but not which file.
        raise TraceFormatError(f"{path}: not a readable Parquet file: {exc}") from exc
    return header, (list(row) for row in zip(*columns, strict=True))


def parse_rows(
    path: Path,
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    strict: bool,
    line_word: str,
) -> Trace | None:
    """Check and group rows into a snapshot and events; None when there are no rows."""
    names = [h.strip() for h in header]
    twice = repeated_column(header)
    if twice is not None:
        raise TraceFormatError(
            f"{path}:1: column {twice!r} appears more than once in header {','.join(header)!r}"
        )
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise TraceFormatError(
            f"{path}:1: missing required column(s) {', '.join(missing)} in header "
            f"{','.join(header)!r}"
        )
    i_time, i_node, i_idle = (names.index(c) for c in REQUIRED_COLUMNS)
    i_window = names.index("window_s") if "window_s" in names else -1
    width = max(i_time, i_node, i_idle, i_window) + 1

    times: dict[str, float] = {}  # the log repeats each time string on every row of an event
    nodes: list[str] = []
    state: dict[str, bool] = {}
    events: list[PoolEvent] = []
    snapshot_idle: frozenset[str] = frozenset()
    snapshot_windows: dict[str, float | None] = {}
    start_s = last_s = math.nan
    group: dict[str, tuple[bool, float | None, int]] = {}
    group_s = math.nan
    group_line = 0

    def where(line: int) -> str:
        return f"{path}:{line}" if line_word == "line" else f"{path}: row {line}"

    def flush() -> None:
        nonlocal snapshot_idle, snapshot_windows, start_s
        if not nodes:  # the first time: the snapshot (every later node is one of its)
            for node, (_, _, line) in group.items():
                problem = node_name_problem(node)
                if problem:
                    raise TraceFormatError(f"{where(line)}: node {node!r} {problem}")
            nodes.extend(group)
            for node, (idle, _, _) in group.items():
                state[node] = idle
            snapshot_idle = frozenset(n for n, (idle, _, _) in group.items() if idle)
            if i_window >= 0:
                snapshot_windows = {n: w for n, (idle, w, _) in group.items() if idle}
            start_s = group_s
            return
        joined: list[str] = []
        left: list[str] = []
        windows: dict[str, float | None] = {}
        for node, (idle, window, line) in group.items():
            before = state.get(node)
            if before is None:
                if strict:
                    raise TraceFormatError(
                        f"{where(line)}: node {node!r} is missing from the first snapshot "
                        f"({format_time(start_s)})"
                    )
                nodes.append(node)
                state[node] = before = False
            if idle != before:
                (joined if idle else left).append(node)
                state[node] = idle
            if idle and i_window >= 0 and (idle != before or window is not None):
                windows[node] = window
        if joined or left or windows:
            events.append(PoolEvent(group_s, frozenset(joined), frozenset(left), windows))

    line = 1
    for line, row in enumerate(rows, start=2):
        if not row:
            continue
        if len(row) < width:
            raise TraceFormatError(
                f"{where(line)}: {len(row)} field(s), expected {len(names)}: {','.join(row)!r}"
            )
        text = row[i_time]
        time_s = times.get(text)
        if time_s is None:
            try:
                time_s = parse_time_s(text)
            except ValueError as exc:
                raise TraceFormatError(f"{where(line)}: {exc}") from None
            times[text] = time_s
        node = row[i_node].strip()
        if not node:
            raise TraceFormatError(f"{where(line)}: empty node name")
        idle = _IDLE_VALUES.get(row[i_idle].strip())
        if idle is None:
            raise TraceFormatError(
                f"{where(line)}: unknown idle value {row[i_idle]!r} for node {node!r} "
                "(expected 1 = idle or 0 = busy)"
            )
        window: float | None = None
        if i_window >= 0 and row[i_window].strip():
            try:
                window = float(row[i_window])
            except ValueError:
                window = math.nan
            if not (window >= 0.0 and math.isfinite(window)):
                raise TraceFormatError(
                    f"{where(line)}: bad window_s {row[i_window]!r} for node {node!r} "
                    "(expected seconds >= 0, or empty)"
                )
        if time_s != group_s:
            if time_s < group_s:
                raise TraceFormatError(
                    f"{where(line)}: time {text!r} is earlier than the time "
                    f"{format_time(group_s)} at {where(group_line)}; rows must be sorted by time"
                )
            if group:
                flush()
            group = {}
            group_s = time_s
            group_line = line
        if node in group:
            raise TraceFormatError(
                f"{where(line)}: node {node!r} listed twice at time {text!r} "
                f"(first at {where(group[node][2])})"
            )
        group[node] = (idle, window, line)
        last_s = time_s
    if not group:
        return None
    flush()
    log.debug("read %s: %d nodes, %d events, %d lines", path, len(nodes), len(events), line)
    return Trace(
        nodes=tuple(nodes),
        initial_idle=snapshot_idle,
        start_s=start_s,
        end_s=last_s,
        events=tuple(events),
        initial_windows_s=snapshot_windows,
        source=str(path),
    )
