"""Each trainer's node count over time, as the replay's loop changed it.

The loop hands every change of a trainer's nodes to its driver (rescale, preemption,
cancel) and learns completions from it, so a driver that wraps the replay's own records
them all, with their kind, without a second copy of the loop's bookkeeping. This is
``allocations.csv``: what ``bftrainer report`` draws as the pool's split and the
trainers' Gantt chart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bftrainer.loop import Completion, Progress, TrainerDriver, TrainerState

# The kinds of change, in the order a trainer's life meets them.
CHANGES = ("start", "rescale", "preempt", "complete", "cancel")


@dataclass(frozen=True)
class AllocationChange:
    """At ``time_s`` trainer ``trainer_id`` went to ``nodes`` nodes, by ``change``."""

    time_s: float
    trainer_id: str
    nodes: int
    change: str


class RecordingDriver:
    """A :class:`~bftrainer.loop.TrainerDriver` that records node-count changes and
    passes every call on to ``inner``, which simulates the trainers."""

    def __init__(self, inner: TrainerDriver) -> None:
        self.inner = inner
        self.changes: list[AllocationChange] = []
        self._now_s = 0.0
        self._started: set[str] = set()

    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        self._now_s = now_s
        progress = self.inner.advance(trainers, now_s)
        for report in progress.reports:
            if isinstance(report, Completion):  # the loop frees its nodes on this report
                self._add(report.trainer_id, 0, "complete")
        return progress

    def next_wakeup_s(self, trainers: Sequence[TrainerState], now_s: float) -> float:
        return self.inner.next_wakeup_s(trainers, now_s)

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        self._add(trainer.id, len(trainer.nodes), "preempt")
        return self.inner.preempt(trainer, old_count)

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        if len(nodes) != len(trainer.nodes):
            first = nodes and trainer.id not in self._started
            if first:
                self._started.add(trainer.id)
            self._add(trainer.id, len(nodes), "start" if first else "rescale")
        return self.inner.rescale(trainer, nodes)

    def cancel(self, trainer: TrainerState) -> None:
        self._add(trainer.id, 0, "cancel")
        self.inner.cancel(trainer)

    def _add(self, trainer_id: str, nodes: int, change: str) -> None:
        self.changes.append(AllocationChange(self._now_s, trainer_id, nodes, change))
