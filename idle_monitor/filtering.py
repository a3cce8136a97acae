"""Turning raw monitor records into pool events, as in section 2.1 of the BFTrainer paper.

A monitor polls the scheduler and gets one *record* per poll: the full set of idle nodes.
Between one job releasing a node and the next job taking it, the node often shows idle in
a single record; such a blip is scheduler churn, not a usable node, so it is not a join.
Records that change nothing are not events.

Rule (one implementation, used offline and live): a node joins the pool when it is idle in
two consecutive records, and leaves it in the first record where it is not idle. So a join
is reported one record late, at the time of the second idle record: a live pool cannot know
earlier that the node is not a blip. Leaves are never delayed: the main scheduler already
has the node back. Nodes idle in the first record are the initial pool, unfiltered, since
how long they had been idle is unknown.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from bftrainer.idle_monitor.events import PoolEvent

log = logging.getLogger(__name__)


class RecordOrderError(ValueError):
    """A record older than the one before it: a monitor must push records in time order."""


class BlipFilter:
    """Incremental blip filter: push each raw record, get the pool event it causes.

    ``push(time_s, idle)`` returns the ``PoolEvent`` (joins confirmed by this record, leaves
    seen in it) or ``None`` when the pool does not change. The first push returns the
    initial pool as joins (``None`` if it is empty).
    """

    def __init__(self) -> None:
        self._pool: frozenset[str] = frozenset()
        self._previous: frozenset[str] | None = None
        self._previous_s = float("-inf")

    @property
    def pool(self) -> frozenset[str]:
        """The filtered pool after the last record."""
        return self._pool

    @property
    def pending(self) -> frozenset[str]:
        """Nodes idle in the last record that join if the next record confirms them."""
        if self._previous is None:
            return frozenset()
        return self._previous - self._pool

    def push(self, time_s: float, idle: frozenset[str]) -> PoolEvent | None:
        if time_s < self._previous_s:
            raise RecordOrderError(
                f"record at t={time_s} is older than the previous one at t={self._previous_s}"
            )
        previous = self._previous
        self._previous, self._previous_s = idle, time_s
        if previous is None:
            self._pool = idle
            return PoolEvent(time_s, joined=idle) if idle else None
        joined = (previous & idle) - self._pool
        left = self._pool - idle
        if not joined and not left:
            return None
        self._pool = (self._pool | joined) - left
        return PoolEvent(time_s, joined=joined, left=left)


def filter_records(records: Iterable[tuple[float, frozenset[str]]]) -> Iterator[PoolEvent]:
    """Pool events from a sequence of ``(time_s, idle nodes)`` records, blips removed.

    The first event, if any, is the initial pool. A node idle only in the last record never
    joins: no later record confirms it.
    """
    blip_filter = BlipFilter()
    dropped = 0
    for time_s, idle in records:
        event = blip_filter.push(time_s, idle)
        if event is None:
            dropped += 1
        else:
            yield event
    log.debug("blip filter: %d record(s) changed nothing after filtering", dropped)
