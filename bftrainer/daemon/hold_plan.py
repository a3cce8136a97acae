"""Which pool nodes the daemon holds: a pure function of the pool, the holders and demand.

The main scheduler's pool (idle nodes nobody planned for) is what the daemon *may* take;
a node becomes usable by a trainer only once a holder job runs on it. Holding costs the
centre nothing while the node would idle anyway, but a holder is a job in the scheduler's
queue: the daemon holds only what its trainers can use (``demand``: the admitted
trainers' ``n_max`` summed), never more than the pool, and lets go of the rest.

The plan prefers the nodes that stay free longest (an open-ended window first), so that
trainers are not built on nodes about to be taken back, and releases first what is
pending (not yet usable), then the shortest windows. A node that has just become spare
is kept a little while (``keep``, the held pool's ``SPARE_KEPT_POLLS``): in a search,
a trial's end is followed within a poll or two by the next trial, and releasing its
holder only to submit a new one then cost a scheduler cycle each time (the HPO e2e
released and held node4 again within a second, three times). Nodes a trainer runs on
are never released here: they leave only when the main scheduler preempts their holder,
or when the allocator frees them (the daemon then calls this again).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class HoldPlan:
    """What to change: nodes to submit a holder for, and nodes whose holder to cancel."""

    acquire: tuple[str, ...] = ()
    release: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.acquire and not self.release


def _stays_s(windows_s: Mapping[str, float | None], node: str) -> float:
    w = windows_s.get(node)
    return math.inf if w is None else w


def plan_holders(
    pool: Collection[str],
    windows_s: Mapping[str, float | None],
    running: Collection[str],
    pending: Collection[str],
    allocated: Collection[str],
    demand: int,
    keep: Collection[str] = (),
) -> HoldPlan:
    """The holders to add and to cancel so that about ``demand`` pool nodes are held.

    ``pool``: the nodes the main scheduler leaves idle; ``running``/``pending``: nodes
    whose holder job runs / waits in the queue; ``allocated``: nodes trainers run on now;
    ``keep``: spare held pool nodes not to release yet (they count as held).
    A held node outside the pool that no trainer uses is released (the scheduler wants
    it back or will soon); an allocated node is always kept.
    """
    if demand < 0:
        raise ValueError(f"demand must be >= 0, got {demand}")
    held = set(running) | set(pending)
    allocated_set = set(allocated)
    release = [n for n in held if n not in pool and n not in allocated_set]
    kept = [n for n in held if n not in release]
    target = max(min(demand, len(pool)), len(allocated_set & held))
    acquire: list[str] = []
    if len(kept) < target:
        free = [n for n in pool if n not in held]
        # Longest window first; ties by name, so that the plan is the same in every run.
        free.sort(key=lambda n: (-_stays_s(windows_s, n), n))
        acquire = free[: target - len(kept)]
    elif len(kept) > target:
        keep_set = set(keep)
        spare = [n for n in kept if n not in allocated_set and n not in keep_set]
        pending_set = set(pending)
        spare.sort(key=lambda n: (n not in pending_set, _stays_s(windows_s, n), n))
        release += spare[: len(kept) - target]
    return HoldPlan(tuple(acquire), tuple(sorted(release)))


def plan_assigned(
    pool: Collection[str],
    running: Collection[str],
    pending: Collection[str],
    allocated: Collection[str],
    assigned: Collection[str],
) -> HoldPlan:
    """A centre agent's holders: exactly the nodes the centre's allocator gave its
    trainers (``assigned``), those of them that are in the ``pool`` now.

    A held node no longer assigned is released once no trainer of the agent runs on it
    (``allocated``: the agent's loop frees it first, in the same step); a held node
    outside the pool is released as :func:`plan_holders` does.
    """
    held = set(running) | set(pending)
    keep = set(allocated) | (set(assigned) & set(pool))
    acquire = sorted(n for n in assigned if n in pool and n not in held)
    return HoldPlan(tuple(acquire), tuple(sorted(held - keep)))
