"""The durable trace writer: append a live pool to a canonical CSV trace, crash-safe.

``TraceWriter`` writes only changes, fsyncs each event, recovers the state of a file it
continues (dropping a torn last line) and locks the file against a second writer.
"""

from __future__ import annotations

import csv
import fcntl
import io
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import IO

from bftrainer.idle_monitor.trace_model import WRITER_COLUMNS, TraceFormatError
from bftrainer.idle_monitor.trace_reader import parse_rows
from bftrainer.idle_monitor.trace_time import format_time, parse_time_s

log = logging.getLogger(__name__)


class TraceInUseError(RuntimeError):
    """Another ``TraceWriter`` holds the file: two recorders appending would interleave rows."""


def format_window(window_s: float | None) -> str:
    if window_s is None:
        return ""
    return str(int(window_s)) if float(window_s).is_integer() else repr(float(window_s))


def rows_for(
    time_text: str,
    changes: Iterable[tuple[str, bool]],
    windows_s: Mapping[str, float | None] | None,
) -> Iterator[tuple[str, str, str, str]]:
    for node, idle in changes:
        window = windows_s.get(node) if (idle and windows_s) else None
        yield time_text, node, "1" if idle else "0", format_window(window)


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
        header_trace = parse_rows(self._path, header, reader, strict=False, line_word="line")
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
        for time_text, node, flag, window in rows_for(text, changes, windows_s):
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
