"""Generic sources of loop inputs: inputs at known times, and inputs pushed in.

:class:`TimedSource` serves a trace, a job list or a test's script; :class:`Inbox` takes
inputs from other threads. The live pool sources (daemon, centre allocator) live with
the daemon; what they share with the loop -- when a node's known departure is news --
is here (:func:`departure_moved`).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping

from bftrainer.loop.protocols import Clock
from bftrainer.loop.records import Input, LoopError, Polled

# A node's known departure that moves by less than this is no news (no new decision).
WINDOW_TOLERANCE_S = 1.0


def departure_moved(told: Mapping[str, float | None], node: str, at_s: float | None) -> bool:
    """A departure (``at_s``, None: not known) a loop has not been told: a new node, or
    one whose departure moved by ``WINDOW_TOLERANCE_S`` or more (the daemon's and the
    centre allocator's pool sources)."""
    if node not in told:
        return True
    was = told[node]
    if was is None or at_s is None:
        return (was is None) != (at_s is None)
    return abs(was - at_s) >= WINDOW_TOLERANCE_S


class TimedSource:
    """Inputs at known times (a trace, a job list, a test's script), sorted by time;
    each is due once the clock reaches its time. Reads ``items`` lazily."""

    def __init__(self, items: Iterable[tuple[float, Input]]) -> None:
        self._items: Iterator[tuple[float, Input]] = iter(items)
        self._next: tuple[float, Input] | None = next(self._items, None)

    @property
    def exhausted(self) -> bool:
        return self._next is None

    def poll(self, now_s: float) -> Polled:
        due: list[Input] = []
        while self._next is not None and self._next[0] <= now_s:
            t_s, item = self._next
            due.append(item)
            self._next = next(self._items, None)
            if self._next is not None and self._next[0] < t_s:
                raise LoopError(f"inputs out of time order: {self._next[0]} after {t_s}")
        return Polled(tuple(due), self._next[0] if self._next is not None else math.inf)


class Inbox:
    """Inputs pushed from elsewhere (another thread, a signal handler's caller): due at
    the next step. ``put`` wakes the clock it was given."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._queue: deque[Input] = deque()
        self._lock = threading.Lock()
        self._clock = clock

    def put(self, item: Input) -> None:
        with self._lock:
            self._queue.append(item)
        if self._clock is not None:
            self._clock.wake()

    def poll(self, now_s: float) -> Polled:
        with self._lock:
            items = tuple(self._queue)
            self._queue.clear()
        return Polled(items)
