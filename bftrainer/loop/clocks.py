"""The loop's two clocks: the replay's virtual one, the daemon's wall clock.

The loop only waits (``wait_until``) and, from another thread or a signal handler,
wakes (``wake``); which clock it is decides whether waiting is a jump or a sleep.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import time
from collections.abc import Callable

from bftrainer.loop.records import LoopStalledError

MAX_SLEEP_S = 86_400.0  # the longest single sleep of the wall clock


class VirtualClock:
    """The replay's clock: waiting is jumping."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now_s(self) -> float:
        return self._now_s

    def wait_until(self, t_s: float) -> float:
        if not math.isfinite(t_s):
            raise LoopStalledError(
                f"the virtual clock was asked to wait forever at {self._now_s}: no source, "
                "driver or re-decision expects anything (give run() an until_s or a stop)"
            )
        self._now_s = max(self._now_s, t_s)
        return self._now_s

    def wake(self) -> None:
        pass


class WallClock:
    """The daemon's clock: epoch seconds; ``wait_until`` sleeps, ``wake`` interrupts.

    ``wake`` writes a byte to a pipe that the sleep selects on: no lock, so it is safe
    from another thread and from a signal handler (a SIGTERM handler calling
    ``Loop.request_stop``) alike.
    """

    def __init__(self, time_fn: Callable[[], float] = time.time) -> None:
        self._time = time_fn
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)

    def now_s(self) -> float:
        return self._time()

    def wait_until(self, t_s: float) -> float:
        """Sleep until ``t_s`` or a wake. A wait longer than the platform's timeout
        (select() overflows near 1e10 s: a poll interval of 1e12 s in a config) is
        slept a day at a time, never refused."""
        while (delay := t_s - self._time()) > 0:
            timeout = None if math.isinf(delay) else min(delay, MAX_SLEEP_S)
            if select.select([self._read_fd], [], [], timeout)[0]:
                break  # woken
        self._drain()
        return self._time()

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # the pipe is full: it is awake anyway
            os.write(self._write_fd, b"!")

    def _drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read_fd, 4096):
                pass

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
