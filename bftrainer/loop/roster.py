"""The loop's trainers: who is unfinished, in what order they came, who holds nodes.

The loop's work per step follows the trainers that hold nodes (at most the admitted
ones), not every unfinished one: a year's replay queues thousands. So the roster keeps,
beside the unfinished trainers in arrival order, an index of those holding nodes and
the nodes (slots) they hold summed, and :meth:`Roster.set_nodes` is the one place a
trainer's nodes change, which keeps that index true.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from bftrainer.loop.records import LoopError, TrainerState

log = logging.getLogger(__name__)


class Roster:
    """The unfinished trainers (``trainers``, arrival order), the finished ones a replay
    keeps (``finished``: their JCTs are read at the end; a service that runs for months
    records them elsewhere and keeps none, so that its memory does not grow with every
    trainer it ever ran), and who holds nodes."""

    def __init__(self, finished: Sequence[TrainerState] = (), *, keep_finished: bool) -> None:
        self.trainers: dict[str, TrainerState] = {}
        self.finished: list[TrainerState] = list(finished)
        self.keep_finished = keep_finished
        self._finished_ids = {t.id for t in self.finished}
        self._arrival: dict[str, int] = {}  # trainer id -> arrival position
        self._next_arrival = 0
        self._holding: dict[str, TrainerState] = {}  # trainers with nodes, any order
        self._running: list[TrainerState] | None = []  # _holding in arrival order
        self.held = 0  # nodes (slots) the holders hold, summed: the step's record reads it

    def add(self, t: TrainerState) -> None:
        """A trainer joins the unfinished ones, after all others in arrival order."""
        if t.id in self.trainers or t.id in self._finished_ids:
            raise LoopError(f"trainer {t.id!r} arrived twice")
        self.trainers[t.id] = t
        self._arrival[t.id] = self._next_arrival
        self._next_arrival += 1
        if t.nodes:
            self._holding[t.id] = t
            self._running = None
            self.held += len(t.nodes)

    def retire(self, trainer_id: str) -> TrainerState | None:
        """The trainer leaves the unfinished ones, its nodes freed; None if unknown."""
        t = self.trainers.pop(trainer_id, None)
        if t is None:
            return None
        self.set_nodes(t, ())
        del self._arrival[trainer_id]
        if self.keep_finished:
            self.finished.append(t)
            self._finished_ids.add(t.id)
        return t

    def set_nodes(self, t: TrainerState, nodes: tuple[str, ...]) -> None:
        """The one place a trainer's nodes change: keeps the holders' index."""
        if bool(nodes) != bool(t.nodes):
            if nodes:
                self._holding[t.id] = t
            else:
                self._holding.pop(t.id, None)
            self._running = None
        self.held += len(nodes) - len(t.nodes)
        t.nodes = nodes

    def running(self) -> list[TrainerState]:
        """The trainers that hold nodes, in arrival order (a new list each time)."""
        if self._running is None:
            self._running = sorted(self._holding.values(), key=lambda t: self._arrival[t.id])
        return list(self._running)

    @property
    def holding(self) -> int:
        """How many trainers hold nodes."""
        return len(self._holding)

    def held_nodes(self) -> set[str]:
        """The nodes some trainer holds (with shared nodes, each once)."""
        return {n for t in self._holding.values() for n in t.nodes}
