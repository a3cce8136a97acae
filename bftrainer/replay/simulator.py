"""The replay's trainer driver: progress simulated from each job's scaling profile.

Between events a running trainer processes rate x dt samples. A scale-up costs R_up
seconds of its current rate, a scale-down R_dw; a trainer whose nodes leave is forced
down and pays R_dw at the rate it had (the preemption cost). The same accounting as the
paper's replayer (``../shared/notes/replay-metrics.md``).

With S > 1 slots per node a job's curve counts slots packed on the fewest nodes; slots
spread over more nodes run at ``1 - DEFAULT_SPREAD_PENALTY`` of it, the allocator's
default for a curve given per slot count (docs/allocator.md, "Slots"). Waste counts
node-equivalents (slot-seconds / S).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bftrainer.loop import Completion, Progress, TrainerState
from bftrainer.milp.slot_packing import DEFAULT_SPREAD_PENALTY, is_packed

DONE_RTOL = 1e-9


@dataclass
class Waste:
    """Node-seconds that trainers held without keeping the work, by cause: the simulated
    drivers sum them for the replay's ``wasted_node_hours`` (samples alone cannot say
    how many nodes a cost held)."""

    stalled_node_s: float = 0.0  # elastic: a rescale or preemption, R x the nodes it had
    lost_node_s: float = 0.0  # rigid: training since the last checkpoint, lost to a kill
    restart_node_s: float = 0.0  # rigid: a requeued job reading its checkpoint back
    kills: int = 0  # rigid: jobs killed because one of their nodes left

    @property
    def total_node_s(self) -> float:
        return self.stalled_node_s + self.lost_node_s + self.restart_node_s


def capped_cost(trainer: TrainerState, cost: float) -> tuple[float, float]:
    """A rescale's or preemption's cost in samples, and the share of it kept: never
    more than the trainer's progress so far (docs/replay.md, "Costs"). A cost beyond
    what its time on the nodes earned takes its progress to 0, never below: the paper
    books R seconds at the old rate at once, which, R over the time the trainer held
    the nodes, would book work it never did."""
    room = max(0.0, trainer.progress_samples)
    if cost <= room:
        return cost, 1.0
    return room, (room / cost if cost > 0 else 0.0)


class SimulatedDriver:
    """The :class:`bftrainer.loop.TrainerDriver` of the plain replay."""

    def __init__(self, slots_per_node: int = 1) -> None:
        self.slots_per_node = slots_per_node
        self._now_s: float | None = None
        self._reported: set[str] = set()
        self.waste = Waste()

    def _plain(self) -> bool:
        """True when a trainer's rate is its job's curve at its node count (this class,
        one slot per node): the hot loops read ``job.rate_sps`` directly instead of two
        calls per trainer that give it (a replay steps every trainer at every event)."""
        cls = type(self)
        return (
            self.slots_per_node == 1
            and cls._rate is SimulatedDriver._rate
            and cls.true_rate_sps is SimulatedDriver.true_rate_sps
        )

    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        dt_s = 0.0 if self._now_s is None else now_s - self._now_s
        self._now_s = now_s
        total = 0.0
        done: list[Completion] = []
        plain = self._plain()
        for t in trainers:
            if dt_s > 0:
                # A trainer done within the step (its wake-up is rounded to the clock's
                # resolution) processes no more than its work.
                left = max(0.0, t.job.work_samples - t.progress_samples)
                rate = t.job.rate_sps(len(t.nodes)) if plain else self._rate(t, t.nodes)
                samples = min(rate * dt_s, left)
                t.processed_samples += samples
                total += samples
            if t.id not in self._reported and self._is_done(t):
                self._reported.add(t.id)
                done.append(Completion(t.id))
        return Progress(total, tuple(done))

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        # With slots, at the packed rate of what it had (the holding before is gone).
        seconds = trainer.job.rescale_down_s
        cost, share = capped_cost(trainer, seconds * self.true_rate_sps(trainer, old_count))
        trainer.preemption_cost_samples += cost
        self.waste.stalled_node_s += self._nodes(seconds * old_count) * share
        return cost

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        old, new = len(trainer.nodes), len(nodes)
        if new == old:
            return 0.0
        seconds = trainer.job.rescale_up_s if new > old else trainer.job.rescale_down_s
        cost, share = capped_cost(trainer, seconds * self._rate(trainer, trainer.nodes))
        trainer.rescale_cost_samples += cost
        self.waste.stalled_node_s += self._nodes(seconds * old) * share
        if old:
            trainer.rescales += 1
        return cost

    def cancel(self, trainer: TrainerState) -> None:
        pass

    def _rate(self, trainer: TrainerState, holding: tuple[str, ...]) -> float:
        """Samples/s on ``holding``: the curve, less the spread penalty with slots."""
        rate = self.true_rate_sps(trainer, len(holding))
        if self.slots_per_node > 1 and not is_packed(holding, self.slots_per_node):
            rate *= 1.0 - DEFAULT_SPREAD_PENALTY
        return rate

    def true_rate_sps(self, trainer: TrainerState, count: int) -> float:
        """The trainer's true rate at ``count`` packed nodes (slots): its job's curve. A
        driver whose policy must not see that curve keeps it elsewhere."""
        return trainer.job.rate_sps(count)

    def _nodes(self, slot_s: float) -> float:
        return slot_s if self.slots_per_node == 1 else slot_s / self.slots_per_node

    @staticmethod
    def _is_done(trainer: TrainerState) -> bool:
        return trainer.progress_samples >= trainer.job.work_samples * (1 - DONE_RTOL)

    def next_wakeup_s(self, trainers: Sequence[TrainerState], now_s: float) -> float:
        """The next completion at current rates, never ``now_s`` itself.

        At trace times (~1.6e9 s, 2.4e-7 s apart) a little work left at a high rate
        finishes within the clock's resolution: ``now_s + left / rate == now_s``, and a
        loop woken at ``now_s`` again would never move. The next representable instant
        processes ``rate x ulp >= left`` samples, so the work is done there, at any
        job size, rate or clock magnitude.
        """
        best = math.inf
        plain = self._plain()
        for t in trainers:
            rate = t.job.rate_sps(len(t.nodes)) if plain else self._rate(t, t.nodes)
            if rate > 0:
                left_s = max(0.0, t.job.work_samples - t.progress_samples) / rate
                best = min(best, max(now_s + left_s, math.nextafter(now_s, math.inf)))
        return best
