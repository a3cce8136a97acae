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
from dataclasses import replace

from bftrainer.loop import Decision, Policy, PolicyInputs, Refused, TrainerState


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


class Refusing:
    """``inner``'s decision, with no trainer on a node refused to its user (the
    refusals and the time come in the inputs: :class:`~bftrainer.loop.Refused`).

    Such a node is swapped for a pool node nobody got and the user may have (nodes are
    alike to the policies: the count is what they chose). A trainer that still falls
    short is capped at what it could have (none, below its minimum), and ``inner``
    decides once more: so the nodes it could not take go where ``inner`` would put them,
    not idle until some later event.
    """

    def __init__(self, inner: Policy) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    def admit(
        self, trainers: Iterable[TrainerState], limit: int, fair_by: str
    ) -> list[TrainerState]:
        return self.inner.admit(trainers, limit, fair_by)

    def decide(self, inputs: PolicyInputs) -> Decision:
        pool, trainers = inputs.pool, inputs.trainers
        refused = {t.id: set(inputs.refused_to(t.job.user)) for t in trainers}
        decision = self.inner.decide(inputs)
        if not any(refused.values()):
            return decision
        nodes, short = _swap_refused(decision.nodes, pool, trainers, refused)
        solve_s = decision.solve_s
        if short:
            capped = [
                _capped(t, nodes[t.id], refused[t.id]) if t.id in short else t
                for t in trainers
                if t.id not in short or nodes[t.id]
            ]
            decision = self.inner.decide(replace(inputs, trainers=capped))
            solve_s += decision.solve_s
            nodes, _ = _swap_refused(decision.nodes, pool, capped, refused)
            nodes.update({t: () for t in short if t not in nodes})
        return replace(decision, nodes=nodes, solve_s=solve_s)


def _swap_refused(
    decided: Mapping[str, tuple[str, ...]],
    pool: tuple[str, ...],
    trainers: list[TrainerState],
    refused: Mapping[str, set[str]],
) -> tuple[dict[str, tuple[str, ...]], set[str]]:
    """``decided`` with each refused node swapped for a free one the trainer may have;
    and the trainers that fell short (their count kept, or none below the minimum)."""
    nodes = dict(decided)
    free = sorted(set(pool) - {n for ns in nodes.values() for n in ns})
    short = set()
    for t in trainers:
        mine = nodes.get(t.id, ())
        kept = [n for n in mine if n not in refused[t.id]]
        if len(kept) == len(mine):
            continue
        while len(kept) < len(mine):
            swap = next((n for n in free if n not in refused[t.id]), None)
            if swap is None:
                short.add(t.id)
                break
            free.remove(swap)
            kept.append(swap)
        if len(kept) < t.job.n_min:
            free = sorted({*free, *kept})
            kept = []
        nodes[t.id] = tuple(sorted(kept))
    return nodes, short


def _capped(t: TrainerState, could: tuple[str, ...], refused: set[str]) -> TrainerState:
    """``t`` as it can be now: at most as many nodes as it ``could`` have, on those it
    holds and may keep. It may hold more than that (the others went to peers): it then
    keeps the ones it could have first, as a shrink would."""
    mine = [n for n in t.nodes if n not in refused]
    kept = sorted(mine, key=lambda n: (n not in could, n))[: len(could)]
    return replace(t, job=replace(t.job, n_max=len(could)), nodes=tuple(sorted(kept)))
