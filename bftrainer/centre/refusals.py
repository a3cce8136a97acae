"""Nodes a user's agent could not get: the allocator stops giving them to that user.

The allocator decides every trainer's nodes; each agent then holds them with its user's
rights (a holder job per node) and reports, at every sync, the nodes it holds. A node
assigned to a user is held within a backfill pass and a sync. One still not held after
``hold_grace_s`` is one this user cannot get now: a QOS or account limit, a reservation,
a partition the user may not use. Assigned again to the same user it would stay idle,
so it is *refused* to that user for ``refused_for_s``: the next decision gives the
trainer another node, and leaves this one to the other users' trainers. Once the
refusal ends the user may get the node again (a limit may have been lifted).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from bftrainer.loop import Refused


class Refusals:
    """Which node each user could not hold, until when (the allocator's clock)."""

    def __init__(self, hold_grace_s: float, refused_for_s: float, holder_lease_s: float) -> None:
        self._lock = threading.Lock()  # the agents' syncs and the loop's decisions
        self.hold_grace_s = hold_grace_s
        self.refused_for_s = refused_for_s
        # How long another user's holders may stay on a node after that user's agent
        # last said so (a silent agent's holders end when their leases run out).
        self.holder_lease_s = holder_lease_s
        self._assigned_at: dict[str, dict[str, float]] = {}  # trainer -> node -> since
        self._until: dict[tuple[str | None, str], float] = {}  # (user, node) -> refused until
        self._held: dict[str, tuple[float, frozenset[str]]] = {}  # user -> (when, nodes)

    def assigned(self, assignment: Mapping[str, Iterable[str]], now_s: float) -> None:
        """The node sets just published: a node's wait starts when first assigned."""
        with self._lock:
            before = self._assigned_at
            self._assigned_at = {
                t: {n: before.get(t, {}).get(n, now_s) for n in nodes}
                for t, nodes in assignment.items()
            }

    def held(
        self, user: str, trainers: Iterable[str], held: Iterable[str], now_s: float
    ) -> list[str]:
        """An agent's report: ``held``, the nodes ``user``'s holders run on. Its
        ``trainers``' assigned nodes not among them become refused after the grace,
        counted from the assignment or from when another user's holder last was there
        (a node given over is free only once the other user's holder has ended).
        Returns the nodes newly refused. Runs at every agent's every sync: in the usual
        case, every assigned node held, it reads only this user's assignment."""
        held = frozenset(held)
        new: list[str] = []
        with self._lock:
            self._held[user] = (now_s, held)
            waiting = sorted(
                (node, trainer)
                for trainer in trainers
                for node in self._assigned_at.get(trainer, {})
                if node not in held
            )
            if not waiting:
                return new
            others = {
                n
                for u, (when, nodes) in self._held.items()
                if u != user and now_s - when < self.holder_lease_s
                for n in nodes
            }
            self._until = {k: until for k, until in self._until.items() if until > now_s}
            for node, trainer in waiting:
                assigned = self._assigned_at[trainer]
                if node in others:
                    assigned[node] = now_s
                elif now_s - assigned[node] >= self.hold_grace_s and (
                    (user, node) not in self._until
                ):
                    self._until[(user, node)] = now_s + self.refused_for_s
                    new.append(node)
        return new

    def table(self) -> Refused:
        """Every refusal with its end, as the loop's input (the policy reads no table)."""
        with self._lock:
            return Refused(dict(self._until))
