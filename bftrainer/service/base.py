"""What the daemon and the centre's allocator share around the loop on the wall clock:
being asked to stop, trying the scheduler until it answers, and the loop's observer.

Both run the one core loop live (docs/architecture.md); they differ in their sources,
their driver and what they publish, not in this mechanism, so it is written once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from bftrainer.loop import Clock, Loop, Step

log = logging.getLogger(__name__)

T = TypeVar("T")


class LiveService:
    """A service that runs the loop on a wall clock until asked to stop."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.loop: Loop | None = None
        self._stop_requested = False

    @property
    def stopping(self) -> bool:
        return self._stop_requested

    def request_stop(self) -> None:
        """Stop at the next wake-up: whatever waits (a retry, the loop) wakes now."""
        self._stop_requested = True
        self.clock.wake()
        if self.loop is not None:
            self.loop.request_stop()

    def until_answered(self, attempt: Callable[[float], T | None], every_s: float) -> T | None:
        """``attempt(now_s)`` every ``every_s`` until it gives a value, however long the
        scheduler takes (each failed try says why in its own one line); None once asked
        to stop meanwhile."""
        while not self._stop_requested:
            now_s = self.clock.now_s()
            value = attempt(now_s)
            if value is not None:
                return value
            self.clock.wait_until(now_s + every_s)
        return None


class StepObserver:
    """The loop's observer of a live service: after each recorded step ``after_step``
    (the daemon checks its pool, the allocator sends out the node sets), at every
    wake-up ``publish`` (the metrics, with a decision's latency), and each decision in
    one debug line."""

    def __init__(
        self,
        after_step: Callable[[Step], None],
        publish: Callable[[float | None], None] | None = None,
    ) -> None:
        self.after_step = after_step
        self.publish = publish

    def interval(self, t0_s: float, t1_s: float, pool_nodes: int, processed: float) -> None:
        # Each wake-up (a poll, news from a trainer or an agent) refreshes the metrics,
        # so that they do not wait for the next event.
        if self.publish is not None:
            self.publish(None)

    def step(self, step: Step) -> None:
        self.after_step(step)
        if self.publish is not None:
            self.publish(step.latency_s if step.decided else None)
        if step.decided:
            log.debug(
                "decided at %.1f: pool %d, allocated %d, running %d, waiting %d "
                "(joined %d, left %d, arrivals %d, completions %d) %s in %.1f ms, "
                "latency %.1f ms, T_fwd %s",
                step.time_s,
                step.pool_nodes,
                step.allocated_nodes,
                step.running,
                step.waiting,
                step.joined,
                step.left,
                step.arrivals,
                step.completions,
                step.status,
                step.solve_s * 1e3,
                step.latency_s * 1e3,
                "-" if step.t_fwd_s is None else f"{step.t_fwd_s:.0f} s",
            )
