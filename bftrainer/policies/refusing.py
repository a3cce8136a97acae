"""The allocator's policy wrapped so that no trainer gets a node refused to its user
(the refusals, :mod:`bftrainer.centre.refusals`, reach the loop as a
:class:`~bftrainer.loop.Refused` input, each with its end; the policy compares the ends
with ``PolicyInputs.now_s``, and reads no table)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from bftrainer.loop import Decision, Policy, PolicyInputs, TrainerState


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
