"""The pool trace in memory (``Trace``), its columns and the errors of the format.

A trace is a snapshot of the pool at ``start_s`` and the events after it; the canonical
file format (``idle_monitor/trace.py``) stores it as rows ``time,node,idle[,window_s]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.trace_time import check_epoch_s, format_time

REQUIRED_COLUMNS = ("time", "node", "idle")
WRITER_COLUMNS = ("time", "node", "idle", "window_s")
# Informative, written by `trace from-log`: how long a joining node stayed idle in fact.
LOG_COLUMNS = (*WRITER_COLUMNS, "idle_s")


class TraceFormatError(ValueError):
    """A trace file (or a write to one) breaks the format; the message names file, line, value."""


class TraceRangeError(ValueError):
    """A slice (``nodes``, ``start_s``, ``end_s``) selecting nothing or outside the trace."""


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
