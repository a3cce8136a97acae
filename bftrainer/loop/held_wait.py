"""Nodes on their way: a decision that takes nodes from a running trainer waits for them.

In the daemon a trainer's arrival raises the demand, and the planner holds more pool
nodes for it, which join a poll or two later. A decision made before they join would
shrink running trainers to give the newcomer their nodes, then grow them back on the
new ones: two rescales of trainers that lose nothing in the end. So while nodes are
coming (the planner's ``Planned.holdable``: more holdable nodes than the pool has, and a
demand for them), a decision that takes nodes from a running trainer is put off, at
most ``WAIT_FOR_HELD_S`` after it was first put off; one that only starts or grows
trainers is made at once. The replay has no planner: it never waits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from bftrainer.loop.records import TrainerState

log = logging.getLogger(__name__)

# Holders start within a scheduler cycle (about a second on the local Slurm; Slurm's
# backfill pass, 30 s by default at a centre): a newcomer that waits that long costs
# less than two rescales of the trainers it would have shrunk.
WAIT_FOR_HELD_S = 30.0


class HeldWait:
    """Whether the loop's decision waits for held nodes, and until when."""

    def __init__(self) -> None:
        self.holdable: int | None = None  # the planner's last Planned.holdable
        self.since_s: float | None = None  # when a decision was first put off

    def due_s(self) -> float | None:
        """When a put-off decision is made whatever comes (None: none is put off)."""
        return None if self.since_s is None else self.since_s + WAIT_FOR_HELD_S

    def waits(
        self,
        now_s: float,
        demand_nodes: int,
        pool_nodes: int,
        trainers: Sequence[TrainerState],
        nodes: Mapping[str, tuple[str, ...]],
        evicted: bool = False,
    ) -> bool:
        """Whether a decision giving ``trainers`` their ``nodes`` is put off now: it
        takes nodes from a running trainer while more are coming, within the bound. A
        step that ``evicted`` a trainer (another user's newcomer took its place) decides."""
        if evicted or self.holdable is None or min(demand_nodes, self.holdable) <= pool_nodes:
            self.since_s = None  # nothing is coming: the pool is all there is
            return False
        takes = [t.id for t in trainers if t.nodes and not set(t.nodes) <= set(nodes.get(t.id, ()))]
        if not takes:
            self.since_s = None
            return False
        if self.since_s is None:
            self.since_s = now_s
            log.info(
                "a decision that takes nodes from %s waits up to %g s for the nodes "
                "being held for the queue",
                ", ".join(takes),
                WAIT_FOR_HELD_S,
            )
        if now_s < self.since_s + WAIT_FOR_HELD_S:
            return True
        self.since_s = None
        return False
