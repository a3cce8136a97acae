"""The runtime's configuration: the batch it runs, its learning rate, and re-tuning.

A base class of :class:`bftrainer.trainers.runtime.ElasticRuntime`, apart from its loop
(as ``runtime_snapshot.py`` is for its state): at a reset the loop hands the agent's
choice to :meth:`RuntimeTuning._configure`; between resets rank 0 decides a re-tune
(:meth:`RuntimeTuning.retune_decision`, the cadence's and the agent's rule) and every
rank applies it at the same step (:meth:`RuntimeTuning._move`). The attributes it reads
are the runtime's, declared here.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from bftrainer.trainers import channel
from bftrainer.trainers.agent import PolluxAgent
from bftrainer.trainers.comm import Comm
from bftrainer.trainers.goodput import NoFeasibleConfigError
from bftrainer.trainers.probe import TorchGradientProbe
from bftrainer.trainers.retune_cadence import RetuneCadence
from bftrainer.trainers.runtime_options import RuntimeOptions
from bftrainer.trainers.runtime_state import RunProgress
from bftrainer.trainers.sampler import ElasticSampler

logger = logging.getLogger("bftrainer.trainers.runtime")  # the trainer log's name, as before

# The step-time model is refitted when a configuration was timed that the last fit did
# not see, else at most this often: a fit over several configurations takes about
# 0.2 s here, which the training loop pays (Pollux refits on its scheduling interval).
REFIT_EVERY_S = 60.0


class RuntimeTuning:
    """Configure, re-tune and set the learning rate (see the module docstring)."""

    opts: RuntimeOptions
    comm: Comm
    agent: PolluxAgent
    optimizer: Any
    base_lrs: list[float]
    probe: TorchGradientProbe
    sampler: ElasticSampler
    progress: RunProgress
    trainer_dir: Path
    overhead_s: dict[str, float]
    _cadence: RetuneCadence
    _channel_writer: channel.ChannelWriter | None
    _last_fit_t: float
    _lr_factor_set: float | None

    def _report(self) -> None:
        raise NotImplementedError  # the runtime's: its progress to the trainer directory

    @property
    def _writer_of_rank0(self) -> channel.ChannelWriter | None:
        """Rank 0's writer of the trainer directory, None on other ranks. Looked up at
        each use: after an elastic reset another process may be rank 0."""
        if self.comm.rank != 0:
            return None
        if self._channel_writer is None:
            self._channel_writer = channel.ChannelWriter(self.trainer_dir)
        return self._channel_writer

    def _configure(self, nodes: int, local: int, accum: int, source: str) -> None:
        """Run (local, accum) from the next step: agent, LR, and the record of it
        (``reset`` in metrics.jsonl, with ``source`` base, agent or retune)."""
        # Every rank counts the replicas there are, whatever the shape its process
        # started in: ranks whose batch (and so LR gain) differed would drift apart.
        config = self.agent.set_config(nodes, local, accum, replicas=self.comm.size)
        self._set_lr()
        p = self.progress
        p.batch_sizes.append(config.batch_size)
        if self._writer_of_rank0 is not None:
            record = self.agent.metrics(refit=self._refit_due())
            self._writer_of_rank0.reset(
                nodes=nodes,
                batch_size=config.batch_size,
                local_bsz=local,
                accum_steps=accum,
                lr=float(self.optimizer.param_groups[0]["lr"]),
                replicas=config.replicas,
                step=p.step,
                samples_done=p.samples_done,
                source=source,
                record=record.to_dict(),
            )
        logger.info(
            "%s: %d node(s), %d replica(s), local batch %d x %d, batch %d, step %d",
            "retune" if source == "retune" else "reset",
            nodes,
            config.replicas,
            local,
            accum + 1,
            config.batch_size,
            p.step,
        )

    def retune_decision(self) -> tuple[int, int] | None:
        """Rank 0, when a re-tune is due: the (local batch, accumulation) to move to at this size,
        or None to stay. Pollux's rule on the agent's model (``goodput.retune_choice``);
        a subclass may decide otherwise (the tests draw random moves): the runtime moves
        every rank there together all the same."""
        if not self.opts.retune:
            return None
        self.probe.flush()
        try:
            best = self.agent.retune(self.opts.switch_gain, refit=self._refit_due())
        except (NoFeasibleConfigError, ValueError) as e:
            logger.warning("agent: no re-tuning: %s", e)
            return None
        return None if best is None else (best.local_bsz, best.accum_steps)

    def _retune(self) -> tuple[int, int] | None:
        """Rank 0: the decision, timed and fed to the cadence; None to stay."""
        began = time.perf_counter()
        move = self.retune_decision()
        cfg = self.agent.config
        if move is not None and move == (cfg.local_bsz, cfg.accum_steps):
            move = None
        now = time.perf_counter()
        self._cadence.record(move is not None, self.sampler.epoch, began, now)
        self.overhead_s["retune"] += now - began
        return move

    def _move(self, move: tuple[int, int]) -> None:
        """Every rank, at the same step: run ``move`` from the next step."""
        began = time.perf_counter()
        self.progress.retunes += 1
        self._configure(self.agent.config.nodes, move[0], move[1], "retune")
        self._report()
        self.overhead_s["retune"] += time.perf_counter() - began

    def _refit_due(self) -> bool:
        """Refit now: a new configuration was timed, or the last fit is old."""
        now = time.perf_counter()
        if self.agent.new_configs or now - self._last_fit_t >= REFIT_EVERY_S:
            self._last_fit_t = now
            return True
        return False

    def _set_lr(self, factor: float | None = None) -> None:
        if factor is None:
            factor = self.agent.lr_factor
        if factor == self._lr_factor_set:
            return
        self._lr_factor_set = factor
        for group, lr0 in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = lr0 * factor
