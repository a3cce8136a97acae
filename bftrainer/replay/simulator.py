"""The replay's trainer driver: progress simulated from each job's scaling profile.

Between events a running trainer processes rate x dt samples. A scale-up costs R_up
seconds of its current rate, a scale-down R_dw; a trainer whose nodes leave is forced
down and pays R_dw at the rate it had (the preemption cost). The same accounting as the
paper's replayer (``../shared/notes/replay-metrics.md``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from bftrainer.loop import TrainerState

DONE_RTOL = 1e-9


class SimulatedDriver:
    def advance(self, trainers: Iterable[TrainerState], dt_s: float) -> float:
        total = 0.0
        for t in trainers:
            samples = t.job.rate_sps(len(t.nodes)) * dt_s
            t.processed_samples += samples
            total += samples
        return total

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        cost = trainer.job.rescale_down_s * trainer.job.rate_sps(old_count)
        trainer.preemption_cost_samples += cost
        return cost

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        old, new = len(trainer.nodes), len(nodes)
        if new == old:
            return 0.0
        seconds = trainer.job.rescale_up_s if new > old else trainer.job.rescale_down_s
        cost = seconds * trainer.job.rate_sps(old)
        trainer.rescale_cost_samples += cost
        if old:
            trainer.rescales += 1
        return cost

    def is_done(self, trainer: TrainerState) -> bool:
        return trainer.progress_samples >= trainer.job.work_samples * (1 - DONE_RTOL)

    def next_completion_s(self, trainers: Iterable[TrainerState], now_s: float) -> float:
        best = math.inf
        for t in trainers:
            rate = t.job.rate_sps(len(t.nodes))
            if rate > 0:
                best = min(best, now_s + max(0.0, t.job.work_samples - t.progress_samples) / rate)
        return best
