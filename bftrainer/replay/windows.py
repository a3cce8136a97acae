"""What the replayed pool source knows of when nodes leave (``bftrainer replay --windows``).

A live pool source states windows (``PoolEvent.windows_s``: seconds until the scheduler
takes a node back) from the scheduler's plan; a trace of idle nodes mostly has none. The
replay gives its events windows of three kinds, so one can measure what a scheduler's
plan is worth to the window-aware allocator (docs/allocator.md, "Windows"):

- ``none``: no window at all (the default for a pool trace; windows a trace carries are
  dropped too), as before windows existed.
- ``trace``: the windows the trace itself states. A trace built from a job log states
  what the scheduler's plan said when each node joined (docs/traces.md); it is the
  default when the replay reads a job log.
- ``oracle``: every idle node's true time of leaving, known in hindsight from the trace,
  stated when the node joins (or at the replay's start). The upper bound of what windows
  can give.
- ``realistic``: a share ``known_share`` of departures is known; each known one is
  stated ``lead_s`` seconds before the node leaves (or when it joins, if later), off by
  a normal error of ``error_s`` seconds (the stated window is never below 0). A
  departure not known is open-ended until the node leaves without warning. What is
  known and the error are drawn per departure instant, not per node: the nodes that
  leave together are taken by one job of the main scheduler, whose planned start the
  scheduler knows (or not), and misjudges, for all of them at once. Drawn from ``seed``
  and the instant, so a replay is reproducible.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.trace import Trace

WINDOW_MODES = ("none", "trace", "oracle", "realistic")


@dataclass(frozen=True)
class WindowKnowledge:
    """What the pool source knows (the module docstring)."""

    mode: str = "none"
    known_share: float = 1.0
    lead_s: float = math.inf
    error_s: float = 0.0
    seed: int = 0


def idle_intervals(trace: Trace) -> Iterator[tuple[str, float, float | None]]:
    """Each idle interval of the trace: (node, joined at, left at or None)."""
    since = {n: trace.start_s for n in trace.initial_idle}
    for e in trace.events:
        for n in sorted(e.left):
            if n in since:
                yield n, since.pop(n), e.time_s
        for n in sorted(e.joined):
            since[n] = e.time_s
    for n in sorted(since):
        yield n, since[n], None


def events_with_windows(trace: Trace, knowledge: WindowKnowledge) -> list[PoolEvent]:
    """The trace's events with the windows ``knowledge`` states, in time order; an event
    at the trace's start states the initial pool's, and a departure stated after its
    node joined (a lead shorter than its idle time) is an event of its own (windows
    only)."""
    if knowledge.mode == "none":
        return [PoolEvent(e.time_s, e.joined, e.left) for e in trace.events]
    if knowledge.mode == "trace":
        known = {n: w for n, w in trace.initial_windows_s.items() if n in trace.initial_idle}
        first = [PoolEvent(trace.start_s, windows_s=known)] if known else []
        return [*first, *trace.events]
    if knowledge.mode not in WINDOW_MODES:
        raise ValueError(f"windows {knowledge.mode!r} is not one of {', '.join(WINDOW_MODES)}")
    stated: dict[float, dict[str, float | None]] = {}
    for node, joined_s, left_s in idle_intervals(trace):
        if left_s is None:
            continue
        at_s, leave_s = joined_s, left_s
        if knowledge.mode == "realistic":
            rng = random.Random(f"{knowledge.seed}:{left_s!r}")  # one draw per instant
            if rng.random() >= knowledge.known_share:
                continue
            at_s = max(joined_s, left_s - knowledge.lead_s)
            if knowledge.error_s > 0:
                leave_s = left_s + rng.gauss(0.0, knowledge.error_s)
        if at_s >= left_s:
            continue  # stated no earlier than it happens: no knowledge
        stated.setdefault(at_s, {})[node] = max(0.0, leave_s - at_s)
    out = [PoolEvent(e.time_s, e.joined, e.left, stated.pop(e.time_s, {})) for e in trace.events]
    out += [PoolEvent(t, windows_s=w) for t, w in stated.items()]
    out.sort(key=lambda e: e.time_s)  # stable: no two events left at one time
    return out
