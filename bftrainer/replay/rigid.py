"""The replay's driver for rigid jobs of a preemptible partition (``--policy scavenger``).

A centre's scavenger partition runs fixed-size jobs that checkpoint now and then. When
the main scheduler takes back any node of one, the job is killed and requeued: the
training since its last checkpoint is lost, and when it starts again it first spends a
restart (launch, reading the checkpoint back) on its nodes. This driver keeps that
accounting; who runs where is the policy's (``bftrainer.policies.registry.ScavengerPolicy``).

- A job checkpoints every ``checkpoint_every_s`` seconds of training since it (re)started
  training; a kill loses ``rate x`` the training time since the last one.
- A restart (a start after a kill; a first start is free, as an elastic trainer's start
  from 0 nodes is) holds the nodes for ``restart_s`` seconds without progress (default:
  the job's R_up, what an elastic trainer pays to grow).
- Both are node-seconds held for nothing: they are counted in :class:`Waste`. The lost
  training is also the trainer's ``preemption_cost_samples``; the restart has no sample
  cost of its own, as the job simply processes nothing while it restarts (a kill during
  a restart then loses nothing more, and nothing is charged twice).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bftrainer.loop import Completion, Progress, TrainerState
from bftrainer.loop.jobs import JobSpec
from bftrainer.replay.simulator import DONE_RTOL, Waste

DEFAULT_CHECKPOINT_EVERY_S = 600.0


class RigidJobError(RuntimeError):
    """A rigid job was asked to change its nodes while it ran; names the job."""


@dataclass(frozen=True)
class _Run:
    size: int
    training_from_s: float  # after the restart, if this run is one


class CheckpointRestartDriver:
    """The :class:`bftrainer.loop.TrainerDriver` of rigid jobs (see the module docstring)."""

    def __init__(
        self,
        checkpoint_every_s: float = DEFAULT_CHECKPOINT_EVERY_S,
        restart_s: float | None = None,
    ) -> None:
        if not (math.isfinite(checkpoint_every_s) and checkpoint_every_s > 0):
            raise ValueError(f"checkpoint_every_s = {checkpoint_every_s!r}: expected > 0")
        if restart_s is not None and not (math.isfinite(restart_s) and restart_s >= 0):
            raise ValueError(f"restart_s = {restart_s!r}: expected a finite number >= 0")
        self.checkpoint_every_s = checkpoint_every_s
        self.restart_s = restart_s
        self.waste = Waste()
        self._now_s: float | None = None
        self._runs: dict[str, _Run] = {}
        self._requeued: set[str] = set()
        self._reported: set[str] = set()

    def restart_cost_s(self, job: JobSpec) -> float:
        """Seconds a requeued job holds its nodes before it trains again."""
        return job.rescale_up_s if self.restart_s is None else self.restart_s

    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        prev_s = now_s if self._now_s is None else self._now_s
        self._now_s = now_s
        total = 0.0
        done: list[Completion] = []
        for t in trainers:
            run = self._run(t)
            if len(t.nodes) != run.size:
                raise RigidJobError(
                    f"rigid job {t.id!r} started on {run.size} nodes runs on {len(t.nodes)}"
                )
            if now_s > prev_s:
                restarting_s = max(0.0, min(now_s, run.training_from_s) - prev_s)
                self.waste.restart_node_s += restarting_s * run.size
                training_s = max(0.0, now_s - max(prev_s, run.training_from_s))
                samples = t.job.rate_sps(run.size) * training_s
                t.processed_samples += samples
                total += samples
            if t.id not in self._reported and self._is_done(t):
                self._reported.add(t.id)
                done.append(Completion(t.id))
        return Progress(total, tuple(done))

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        """A node left: the job is killed (once, if several leave in one step) and
        loses the training since its last checkpoint."""
        run = self._runs.pop(trainer.id, None)
        if run is None:
            return 0.0  # already killed by an earlier change of this step
        lost_s = self.since_checkpoint_s(run.training_from_s)
        cost = trainer.job.rate_sps(run.size) * lost_s
        trainer.preemption_cost_samples += cost
        self.waste.lost_node_s += lost_s * run.size
        self.waste.kills += 1
        self._requeued.add(trainer.id)
        return cost

    def since_checkpoint_s(self, training_from_s: float) -> float:
        """Training seconds since the last checkpoint of a run training from then."""
        trained_s = max(0.0, self._now() - training_from_s)
        return math.fmod(trained_s, self.checkpoint_every_s)

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        """Start a queued job on ``nodes`` (a restart if it was killed before: a new
        launch, on any nodes), or let a killed job's remaining nodes go; a running job
        is never resized or moved."""
        if trainer.id in self._runs:
            raise RigidJobError(
                f"rigid job {trainer.id!r} runs on {len(trainer.nodes)} nodes: it cannot "
                f"move to {len(nodes)} (it only stops when one of its nodes leaves)"
            )
        if not nodes:
            return 0.0
        now = self._now()
        delay_s = 0.0
        if trainer.id in self._requeued:
            delay_s = self.restart_cost_s(trainer.job)
            trainer.rescales += 1  # trainers.csv's rescales: a rigid job's restarts
        self._runs[trainer.id] = _Run(len(nodes), now + delay_s)
        return 0.0

    def cancel(self, trainer: TrainerState) -> None:
        self._runs.pop(trainer.id, None)

    def next_wakeup_s(self, trainers: Sequence[TrainerState], now_s: float) -> float:
        """The next completion, after any restart under way."""
        best = math.inf
        for t in trainers:
            run = self._runs.get(t.id)
            rate = t.job.rate_sps(run.size) if run else 0.0
            if run and rate > 0:
                left = max(0.0, t.job.work_samples - t.progress_samples)
                best = min(best, max(now_s, run.training_from_s) + left / rate)
        return best

    def _run(self, trainer: TrainerState) -> _Run:
        run = self._runs.get(trainer.id)
        if run is None:
            raise RigidJobError(f"rigid job {trainer.id!r} holds nodes but was never started")
        return run

    def _now(self) -> float:
        if self._now_s is None:
            raise RigidJobError("the driver was asked to act before its first advance")
        return self._now_s

    @staticmethod
    def _is_done(trainer: TrainerState) -> bool:
        return trainer.progress_samples >= trainer.job.work_samples * (1 - DONE_RTOL)
