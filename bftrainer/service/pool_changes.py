"""What changed in a live pool since the loop last heard: one diff for the daemon's held
pool (nodes whose holder runs) and the centre allocator's idle pool.

Both sources read, at each poll, a set of nodes and when each leaves (epoch s; None:
not known). The loop is told the nodes that joined or left, and the departure of each
node it has not been told yet: a node that joined, or one whose departure moved by
``WINDOW_TOLERANCE_S`` or more (``bftrainer.loop.departure_moved``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.loop import departure_moved


class PoolChanges:
    """The pool the loop knows, and the departures it was told."""

    def __init__(self, known: Iterable[str] = ()) -> None:
        self.known: set[str] = set(known)
        # When each known node leaves, as last told to the loop. Empty at the start, so
        # a restarted source tells every departure again.
        self.told: dict[str, float | None] = {}

    def start(self, nodes: Iterable[str], leave_at_s: Mapping[str, float | None]) -> None:
        """The loop starts on ``nodes``, told of their departures (``leave_at_s``)."""
        self.known = set(nodes)
        self.told = {n: leave_at_s.get(n) for n in self.known}

    def diff(
        self, nodes: Iterable[str], leave_at_s: Mapping[str, float | None], now_s: float
    ) -> PoolEvent | None:
        """The change from what the loop knows to ``nodes`` (leaving at ``leave_at_s``),
        now taken as known; None when there is nothing to tell."""
        pool = set(nodes)
        joined, left = pool - self.known, self.known - pool
        leaves = {n: leave_at_s.get(n) for n in pool}
        changed = {n: at for n, at in leaves.items() if departure_moved(self.told, n, at)}
        self.known, self.told = pool, leaves
        if not joined and not left and not changed:
            return None
        windows = {n: None if at is None else max(0.0, at - now_s) for n, at in changed.items()}
        return PoolEvent(now_s, joined=frozenset(joined), left=frozenset(left), windows_s=windows)

    def forget(self, nodes: Iterable[str]) -> None:
        """``nodes`` left the loop's pool outside a poll (the daemon released them)."""
        for n in nodes:
            self.known.discard(n)
            self.told.pop(n, None)
