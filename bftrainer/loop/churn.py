"""The pool's churn, and T_fwd from it (``t_fwd_s = "auto"``, ``--tfwd auto``).

**The rule.** T_fwd = ``K`` x the mean time between pool events over the last
``WINDOW_S`` seconds (time watched / events seen; with no event seen, the time watched
counts as one gap), clamped to [``T_FWD_MIN_S``, ``T_FWD_MAX_S``]. A pool that changes
every 80 s (Summit's) gets 160 s, where U is flat between 120 and 300 s; one that has
not changed for half an hour gets the maximum, so a rescale that pays back within an
hour is made. ``K`` = 2 was the best of 1, 1.5, 2 and 3 on the worse of the Summit week
and the synthetic day (docs/benchmarks.md, "T_fwd auto").

The loop owns one :class:`ChurnWindow`, fed by the pool changes it applies (``observe``)
in both modes -- a trace in the replay, the live source in the daemon -- and hands the
policy a :class:`Churn` snapshot at each decision: only what was seen up to now, never a
trace's future. An event is a distinct instant at which nodes joined or left.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

K = 2.0
WINDOW_S = 3600.0
T_FWD_MIN_S = 10.0
T_FWD_MAX_S = 3600.0
# Before anything was watched (the first decision of a run): the paper's value.
T_FWD_FIRST_S = 120.0


@dataclass(frozen=True)
class Churn:
    """What the loop saw of the pool in the last window: ``events`` distinct instants of
    change over ``span_s`` seconds watched (at most the window); and what the pool source
    said of the future: ``windows_s``, the seconds until each pool node is known to be
    taken back (nodes with an open-ended or unknown window are absent)."""

    events: int = 0
    span_s: float = 0.0
    windows_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def mean_gap_s(self) -> float:
        """Mean time between events; with none seen, the time watched (inf if none)."""
        if self.span_s <= 0 and self.events == 0:
            return math.inf
        return self.span_s / max(self.events, 1)


def auto_t_fwd_s(churn: Churn, k: float | None = None) -> float:
    """T_fwd for a pool with this churn (the rule in the module docstring); ``k``
    defaults to :data:`K`."""
    k = K if k is None else k
    gap = churn.mean_gap_s
    if math.isinf(gap):
        return T_FWD_FIRST_S
    return min(max(k * gap, T_FWD_MIN_S), T_FWD_MAX_S)


class ChurnWindow:
    """Times of pool events over a rolling window, from ``start_s`` (when watching began)."""

    def __init__(self, start_s: float, window_s: float = WINDOW_S) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s = {window_s!r}: expected a number > 0")
        self.start_s = start_s
        self.window_s = window_s
        self._times: deque[float] = deque()

    def observe(self, now_s: float) -> None:
        """A pool event (nodes joined or left) at ``now_s``; several at one instant count once."""
        if not self._times or now_s > self._times[-1]:
            self._times.append(now_s)

    def snapshot(self, now_s: float) -> Churn:
        """The churn seen in ``(now_s - window_s, now_s]``."""
        lo = now_s - self.window_s
        while self._times and self._times[0] <= lo:
            self._times.popleft()
        span = max(0.0, now_s - max(self.start_s, lo))
        return Churn(events=sum(1 for t in self._times if t <= now_s), span_s=span)
