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
"""

from __future__ import annotations

import csv
import fcntl
import gzip
import io
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import IO, Any

from bftrainer.idle_monitor.events import PoolEvent

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("time", "node", "idle")
WRITER_COLUMNS = ("time", "node", "idle", "window_s")
_IDLE_VALUES = {"1": True, "0": False}
_GZIP_MAGIC = b"\x1f\x8b"
_PARQUET_MAGIC = b"PAR1"


class TraceFormatError(ValueError):
    """A trace file (or a write to one) breaks the format; the message names file, line, value."""


class TraceRangeError(ValueError):
    """A slice (``nodes``, ``start_s``, ``end_s``) selecting nothing or outside the trace."""


class TraceInUseError(RuntimeError):
    """Another ``TraceWriter`` holds the file: two recorders appending would interleave rows."""


# --------------------------------------------------------------------------- times


# Plausible epoch seconds: 1970-01-01 up to 2200-01-01 UTC. Anything else is a unit or
# typing mistake (epoch milliseconds are ~1e12) that would otherwise overflow date
# arithmetic or stall a virtual clock, so it is refused where a time is read.
EPOCH_MIN_S = 0.0
EPOCH_MAX_S = 7258118400.0
_MS_PER_S = 1000.0
_MS_HINT_MIN_S = 1e8  # 1973: smaller values / 1000 are no date anyone meant


def check_epoch_s(time_s: float, text: str | None = None) -> float:
    """``time_s`` if it is a plausible epoch time, else ``ValueError`` naming it (``text``)."""
    shown = repr(text) if text is not None else repr(time_s)
    if not math.isfinite(time_s):
        raise ValueError(f"time {shown} is not finite")
    if EPOCH_MIN_S <= time_s < EPOCH_MAX_S:
        return time_s
    hint = ""
    if _MS_HINT_MIN_S <= time_s / _MS_PER_S < EPOCH_MAX_S:
        hint = (
            f"; it looks like epoch milliseconds ({format_time(time_s / _MS_PER_S)} "
            "if divided by 1000): times must be epoch seconds"
        )
    raise ValueError(
        f"time {shown} is outside the plausible range of epoch seconds "
        f"({format_time(EPOCH_MIN_S)} to {format_time(EPOCH_MAX_S)}){hint}"
    )


def parse_time_s(text: str) -> float:
    """Epoch seconds (UTC) from epoch seconds, ``YYYY-mm-dd HH:MM:SS`` or ISO-8601.

    A time without an offset is UTC. The result lies in 1970..2200 (``check_epoch_s``).
    Raises ``ValueError`` naming the text.
    """
    s = text.strip()
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        return check_epoch_s(value, text)
    try:
        moment = datetime.fromisoformat(s)
    except ValueError:
        raise ValueError(
            f"bad time {text!r} (expected YYYY-mm-dd HH:MM:SS, ISO-8601 or epoch seconds)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return check_epoch_s(moment.timestamp(), text)


def format_time(time_s: float) -> str:
    """ISO-8601 UTC with ``Z``; fractional seconds (to the microsecond) only when present.

    A time no date can hold (NaN, years past 9999) is shown as epoch seconds, so an error
    message about a bad time never fails itself.
    """
    try:
        moment = datetime.fromtimestamp(time_s, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return f"{time_s!r} (epoch s)"
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + "Z"


def quantize_time_s(time_s: float) -> float:
    """The time a trace file gives back for ``time_s`` once written (microsecond precision)."""
    return parse_time_s(format_time(time_s))


def _format_window(window_s: float | None) -> str:
    if window_s is None:
        return ""
    return str(int(window_s)) if float(window_s).is_integer() else repr(float(window_s))


# --------------------------------------------------------------------------- the trace


@dataclass(frozen=True)
class Trace:
    """A pool trace in memory: a snapshot at ``start_s`` and the events after it.

    ``nodes`` is every node in first-seen order (the order ``nodes=slice(0, 1024)`` cuts, as
    the paper's "first 1,024 nodes"). ``initial_idle`` is the pool at ``start_s``;
    ``initial_windows_s`` its known windows. ``events`` are strictly after ``start_s`` and at
    or before ``end_s``, the last instant the trace covers. ``source`` names the file.
    """

    nodes: tuple[str, ...]
    initial_idle: frozenset[str]
    start_s: float
    end_s: float
    events: tuple[PoolEvent, ...]
    initial_windows_s: Mapping[str, float | None] = field(default_factory=dict)
    source: str = "<memory>"

    def __post_init__(self) -> None:
        for name, value in (("start", self.start_s), ("end", self.end_s)):
            try:
                check_epoch_s(value)
            except ValueError as e:
                raise TraceRangeError(f"trace {self.source} {name}: {e}") from None
        if self.end_s < self.start_s:
            raise ValueError(f"trace {self.source} ends ({self.end_s}) before it starts")

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def slice(
        self,
        *,
        nodes: slice | None = None,
        start_s: float | None = None,
        end_s: float | None = None,
    ) -> Trace:
        """The trace restricted to some nodes and a time range.

        ``nodes`` cuts the first-seen order. The state at ``start_s`` becomes the snapshot
        (an event exactly at ``start_s`` is part of it). ``end_s`` past the trace's end is
        clamped to it. Events that no longer change anything are dropped.
        """
        keep_nodes = self.nodes if nodes is None else self.nodes[nodes]
        if not keep_nodes:
            raise TraceRangeError(
                f"node slice {_slice_text(nodes)} selects no node of the {len(self.nodes)} "
                f"in {self.source}"
            )
        lo = self.start_s if start_s is None else start_s
        hi = self.end_s if end_s is None else min(end_s, self.end_s)
        if lo < self.start_s:
            raise TraceRangeError(
                f"start {format_time(lo)} is before {self.source} starts "
                f"({format_time(self.start_s)})"
            )
        if lo > self.end_s:
            raise TraceRangeError(
                f"start {format_time(lo)} is after {self.source} ends ({format_time(self.end_s)})"
            )
        if hi < lo:
            raise TraceRangeError(f"end {format_time(hi)} is before start {format_time(lo)}")
        keep = frozenset(keep_nodes)
        idle = set(self.initial_idle & keep)
        # window (seconds) and the time it was stated at, to carry it forward to `lo`
        windows: dict[str, tuple[float | None, float]] = {
            n: (w, self.start_s) for n, w in self.initial_windows_s.items() if n in keep
        }
        events: list[PoolEvent] = []
        for event in self.events:
            if event.time_s > hi:
                break
            joined = event.joined & keep
            left = event.left & keep
            ev_windows = {n: w for n, w in event.windows_s.items() if n in keep}
            if event.time_s <= lo:
                idle |= joined
                idle -= left
                for n in left:
                    windows.pop(n, None)
                for n, w in ev_windows.items():
                    windows[n] = (w, event.time_s)
                continue
            if joined or left or ev_windows:
                events.append(PoolEvent(event.time_s, joined, left, ev_windows))
        initial_windows: dict[str, float | None] = {}
        for n, (w, stated_s) in windows.items():
            if n in idle:
                initial_windows[n] = None if w is None else max(0.0, w - (lo - stated_s))
        return Trace(
            nodes=tuple(keep_nodes),
            initial_idle=frozenset(idle),
            start_s=lo,
            end_s=hi,
            events=tuple(events),
            initial_windows_s=initial_windows,
            source=self.source,
        )


def _slice_text(nodes: slice | None) -> str:
    if nodes is None:
        return ":"
    start = "" if nodes.start is None else str(nodes.start)
    stop = "" if nodes.stop is None else str(nodes.stop)
    return f"{start}:{stop}"


# --------------------------------------------------------------------------- reading


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
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read trace: {exc.strerror or exc}") from exc
    if not magic:
        raise TraceFormatError(f"{path}: empty file (no header)")
    if magic == _PARQUET_MAGIC:
        header, rows = _parquet_rows(path)
        return header, _parse_rows(path, header, rows, strict=strict, line_word="row")
    opener: Any = gzip.open if magic.startswith(_GZIP_MAGIC) else open
    try:
        with opener(path, "rt", newline="", encoding="utf-8") as text:
            reader = csv.reader(text)
            first = next(reader, None)
            if first is None:
                raise TraceFormatError(f"{path}: empty file (no header)")
            return first, _parse_rows(path, first, reader, strict=strict, line_word="line")
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
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
    return header, (list(row) for row in zip(*columns, strict=True))


def _parse_rows(
    path: Path,
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    strict: bool,
    line_word: str,
) -> Trace | None:
    """Check and group rows into a snapshot and events; None when there are no rows."""
    names = [h.strip() for h in header]
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
        if not nodes:  # the first time: the snapshot
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


# --------------------------------------------------------------------------- writing


def _rows_for(
    time_text: str,
    changes: Iterable[tuple[str, bool]],
    windows_s: Mapping[str, float | None] | None,
) -> Iterator[tuple[str, str, str, str]]:
    for node, idle in changes:
        window = windows_s.get(node) if (idle and windows_s) else None
        yield time_text, node, "1" if idle else "0", _format_window(window)


def trace_rows(trace: Trace) -> Iterator[tuple[str, str, str, str]]:
    """The canonical rows ``(time, node, idle, window_s)`` of a trace, snapshot first.

    When the last event is before ``end_s``, a final row restates one node's state at
    ``end_s`` so that the file keeps the trace's full duration.
    """
    start_text = format_time(trace.start_s)
    snapshot = ((n, n in trace.initial_idle) for n in trace.nodes)
    yield from _rows_for(start_text, snapshot, trace.initial_windows_s)
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
        yield from _rows_for(text, changes, event.windows_s)
        last_s = event.time_s
    if trace.end_s > last_s and trace.nodes:
        node = trace.nodes[0]
        yield format_time(trace.end_s), node, "1" if node in idle else "0", ""


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> int:
    """Write a whole trace in the canonical format; the suffix picks the container.

    ``.parquet`` writes Parquet (needs pyarrow), ``.gz`` gzip-compressed CSV, anything else
    CSV. The ``window_s`` column is written only when the trace knows some window. Returns
    the number of rows. For recording live, use ``TraceWriter``.

    Written to a temporary file beside ``path`` and renamed over it when complete, so an
    interrupted write never leaves a cut-off trace (or half of an earlier one's rewrite).
    """
    final = Path(path)
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


class TraceWriter:
    """Append-only recorder of a live pool into a canonical CSV trace.

    Reopening an existing file continues it: the writer reads the file back to recover
    every node's state (dropping a torn last line left by a crash), so the next write adds
    only changes and never a second snapshot. Each ``write`` is flushed and fsync'ed, so a
    crash loses at most the event being written. An exclusive lock keeps a second writer
    off the same file.
    """

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        if self._path.suffix == ".gz" or self._path.suffix == ".parquet":
            raise TraceFormatError(f"{self._path}: TraceWriter writes plain .csv only")
        self._state: dict[str, bool] = {}
        self._last_s = -math.inf
        self._columns: list[str] = list(WRITER_COLUMNS)
        self._next_event_index = 0
        self._file: IO[str] = open(self._path, "a+", newline="", encoding="utf-8")  # noqa: SIM115
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.close()
            raise TraceInUseError(f"{self._path}: another TraceWriter is appending to it") from None
        try:
            self._recover()
        except BaseException:
            self._file.close()
            raise

    def _recover(self) -> None:
        self._file.seek(0, os.SEEK_END)
        size = self._file.tell()
        if size == 0:
            self._append_lines([",".join(self._columns) + "\n"])
            return
        with open(self._path, "rb") as raw:
            data = raw.read()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            log.warning(
                "%s: dropping a torn last line (%d bytes) left by an interrupted write: %r",
                self._path,
                len(data) - complete,
                data[complete:][:80],
            )
            os.truncate(self._path, complete)
            self._file.seek(0, os.SEEK_END)
            data = data[:complete]
        if complete == 0:
            self._append_lines([",".join(self._columns) + "\n"])
            return
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceFormatError(
                f"{self._path}: not a trace (not UTF-8 text at byte {exc.start}); left untouched"
            ) from None
        reader = csv.reader(io.StringIO(text, newline=""))
        header = next(reader)
        header_trace = _parse_rows(self._path, header, reader, strict=False, line_word="line")
        self._columns = [h.strip() for h in header]
        if header_trace is None:
            return
        self._state = {n: n in header_trace.initial_idle for n in header_trace.nodes}
        for event in header_trace.events:
            self._state.update(dict.fromkeys(event.joined, True))
            self._state.update(dict.fromkeys(event.left, False))
        self._last_s = header_trace.end_s
        if "event_index" in self._columns:
            last_row = next(csv.reader([text.rstrip("\n").rsplit("\n", 1)[-1]]))
            index = last_row[self._columns.index("event_index")]
            self._next_event_index = int(index) + 1 if index.strip().isdigit() else 0
        log.info(
            "%s: continuing a trace of %d nodes (%d idle) from %s",
            self._path,
            len(self._state),
            sum(self._state.values()),
            format_time(self._last_s),
        )

    def write(
        self,
        time_s: float,
        idle: Mapping[str, bool],
        windows_s: Mapping[str, float | None] | None = None,
    ) -> int:
        """Record the pool's full state at ``time_s``; write only what changed.

        ``idle`` maps every node the source knows to whether it is idle; a node absent from
        it keeps its recorded state. The first write to a new file is the snapshot (a row
        per node). A time before the last recorded one, or equal to it with changes, raises
        ``TraceFormatError``. Returns the number of rows written (0 when nothing changed).
        """
        if self._file.closed:
            raise TraceFormatError(f"{self._path}: write after close")
        if not math.isfinite(time_s):
            raise TraceFormatError(f"{self._path}: time {time_s!r} is not finite")
        text = format_time(time_s)
        when_s = parse_time_s(text)
        if when_s < self._last_s:
            raise TraceFormatError(
                f"{self._path}: time {text} goes backwards "
                f"(last recorded {format_time(self._last_s)})"
            )
        if self._state:
            changes = [(n, bool(v)) for n, v in idle.items() if self._state.get(n) != bool(v)]
        else:
            changes = [(n, bool(v)) for n, v in idle.items()]
        if not changes:
            return 0
        if when_s == self._last_s:
            raise TraceFormatError(
                f"{self._path}: a second event at {text} would merge with the one recorded there"
            )
        for node, _ in changes:
            if not node or node != node.strip():
                raise TraceFormatError(f"{self._path}: bad node name {node!r} at {text}")
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        for time_text, node, flag, window in _rows_for(text, changes, windows_s):
            values = {"time": time_text, "node": node, "idle": flag, "window_s": window}
            values["event_index"] = str(self._next_event_index)
            writer.writerow([values.get(c, "") for c in self._columns])
        self._append_lines([buffer.getvalue()])
        self._state.update(changes)
        self._last_s = when_s
        self._next_event_index += 1
        return len(changes)

    def mark_end(self, time_s: float) -> int:
        """Repeat one node's state at ``time_s``: a row that changes nothing but says the
        trace was watched until then (docs/traces.md). 0 rows if ``time_s`` adds no time
        or nothing was recorded yet."""
        if self._file.closed or not self._state:
            return 0
        text = format_time(time_s)
        when_s = parse_time_s(text)
        if when_s <= self._last_s:
            return 0
        node = min(self._state)
        values = {"time": text, "node": node, "idle": "1" if self._state[node] else "0"}
        values["event_index"] = str(self._next_event_index)
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerow([values.get(c, "") for c in self._columns])
        self._append_lines([buffer.getvalue()])
        self._last_s = when_s
        self._next_event_index += 1
        return 1

    @property
    def last_s(self) -> float:
        """The time of the last recorded row (-inf for a file with none)."""
        return self._last_s

    def _append_lines(self, chunks: list[str]) -> None:
        self._file.write("".join(chunks))
        self._file.flush()
        os.fsync(self._file.fileno())

    @property
    def state(self) -> Mapping[str, bool]:
        """Every recorded node's current state (True = idle); a read-only view."""
        return MappingProxyType(self._state)

    @property
    def size_bytes(self) -> int:
        return self._path.stat().st_size

    @property
    def path(self) -> Path:
        return self._path

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
