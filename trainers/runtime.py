"""The elastic runtime a user's ``trainer.py`` imports.

The user keeps the model, optimizer, data set and loss; :class:`ElasticRuntime` owns
what elasticity needs (see docs/trainers.md):

* elastic state: model, optimizer, step, the sampler's ``(epoch, position)``, samples
  done, the Pollux agent's state; committed every ``--commit-every-steps`` steps or
  ``--commit-every-s`` seconds, and before a stop, a reset or the end of the work (to
  ``checkpoint.pt`` by rank 0, written on a thread of its own unless ``on_commit`` needs
  it durable first; in memory as well under Horovod), restored after a worker failure,
  resumed from disk after zero hosts or a restart;
* at every reset (and at the start): the agent's ``best_config(nodes)`` (the base
  batch before the first fit) gives the local batch and accumulation steps, the
  learning rate follows ``--lr-rule``, and the step plan restarts at the sampler's
  position, so no sample is skipped or repeated within an epoch;
* between resets, Pollux's re-tuning, apart from checkpoints: at each pass over the
  data (AdaptDL's cadence; ``retune_cadence.py`` says when, and at what cost), rank 0
  asks its agent for the best configuration at the current size and, when it promises
  ``--switch-gain`` more goodput (``goodput.retune_choice``, the replay's rule too),
  sends it on the next step's flags: all ranks move there together at the same step;
* reporting through the trainer directory (:mod:`bftrainer.trainers.channel`);
* work: ``--work-samples`` / ``--work-epochs`` met exactly; rank 0 writes
  ``result.json`` and prints it as one JSON line.

The model's device is the runtime's (:attr:`ElasticRuntime.device`): gradients are
summed there, in buckets that start while ``backward()`` runs
(:mod:`bftrainer.trainers.reducer`); one process sums nothing and copies nothing.
Decisions that must agree across ranks but depend on a clock or a signal (commit now,
stop now, hosts changed, a rank leaving, rank 0's learning-rate factor and batch) ride on the
gradient all-reduce as extra numbers, so the runtime adds no collective to a step; they
are read on the host one step later (every rank acts on the same step), so no step
waits for the device.

Its options are in ``runtime_options.py``; the records it keeps of a run (progress,
``CommitInfo``) in ``runtime_state.py``; its state's snapshot and resume in
``runtime_snapshot.py``; its batch, learning rate and re-tuning in ``runtime_tuning.py``.
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from bftrainer.common import strict_json
from bftrainer.trainers import channel
from bftrainer.trainers.agent import PolluxAgent
from bftrainer.trainers.checkpoint import (
    CheckpointWriter,
    save_checkpoint,
)
from bftrainer.trainers.comm import Comm, WorkerLeaving, make_comm
from bftrainer.trainers.device import model_device
from bftrainer.trainers.goodput import BatchLimitsError, NoFeasibleConfigError
from bftrainer.trainers.probe import TorchGradientProbe
from bftrainer.trainers.reducer import GradientReducer, LaggedFlags
from bftrainer.trainers.retune_cadence import RetuneCadence
from bftrainer.trainers.runtime_options import (
    RuntimeConfigError,
    RuntimeOptions,
    add_runtime_args,
    base_config,
    parse_runtime_args,
)
from bftrainer.trainers.runtime_snapshot import RuntimeSnapshots
from bftrainer.trainers.runtime_state import (
    CommitInfo,
    ReplicaDivergenceError,
    RunProgress,
    default_fetch,
    finite_report,
    model_checksum,
)
from bftrainer.trainers.runtime_tuning import RuntimeTuning
from bftrainer.trainers.sampler import ElasticSampler

__all__ = [
    "CommitInfo",
    "ElasticRuntime",
    "ReplicaDivergenceError",
    "RuntimeConfigError",
    "RuntimeOptions",
    "add_runtime_args",
    "parse_runtime_args",
]

logger = logging.getLogger(__name__)

STOP_CHECK_EVERY_S = 0.5  # how often rank 0 looks for the supervisor's stop request
# The step's flags: commit, stop, hosts updated, leaving (summed), rank 0's LR factor,
# and rank 0's move (local batch, accumulation + 1; zeros: none).
NUM_FLAGS = 7


class ElasticRuntime(RuntimeTuning, RuntimeSnapshots):
    """Runs the user's model, optimizer, data set and loss elastically.

    ``loss_fn(model, batch)``: the mean loss over ``batch`` (``fetch(ids)``; by default
    ``dataset[i]`` collated). ``device_ids``: ``fetch`` gets the ids on the device, the
    epoch's order copied there once (data on the device needs no host work per step).
    ``on_commit`` (rank 0) sees each commit's sample ids (one gather per commit).
    ``grad_scaler`` (``torch.amp.GradScaler``): the loss is scaled before ``backward()``,
    the summed gradients unscaled before the noise probe reads them, the step taken
    through the scaler. ``evaluate(model)`` (rank 0, each commit and the end): a value
    to :meth:`report`, for a search's pruner.
    """

    def __init__(
        self,
        options: RuntimeOptions | argparse.Namespace,
        model: Any,
        optimizer: Any,
        dataset: Any,
        loss_fn: Callable[[Any, Any], Any],
        *,
        fetch: Callable[[np.ndarray], Any] | None = None,
        on_commit: Callable[[CommitInfo], None] | None = None,
        comm: Comm | None = None,
        script: str | None = None,
        grad_scaler: Any | None = None,
        evaluate: Callable[[Any], float] | None = None,
        device_ids: bool = False,
    ) -> None:
        import torch

        self.torch = torch
        opts = options if isinstance(options, RuntimeOptions) else RuntimeOptions.from_args(options)
        self.opts = opts
        try:
            self.limits = opts.limits()
        except BatchLimitsError as e:
            raise RuntimeConfigError(f"batch limits: {e}") from None
        for name in ("commit_every_steps", "work_samples", "work_epochs"):
            value = getattr(opts, name)
            if value is not None and value < 1:
                raise RuntimeConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.num_samples = len(dataset)
        self.sampler = ElasticSampler(self.num_samples, seed=opts.data_seed)
        if opts.work_samples is not None:
            self.work_samples = opts.work_samples
        else:
            self.work_samples = (opts.work_epochs or 1) * self.num_samples
        self.fetch = fetch or default_fetch(dataset)
        self.device_ids = device_ids
        self._order: tuple[int, Any] = (-1, None)  # (epoch, its order on the device)
        self.on_commit = on_commit
        self.evaluate = evaluate
        self._reported_samples = -1  # the samples of the last report (one per commit)
        stem = Path(script or sys.argv[0]).stem or "trainer"
        self.trainer_dir = Path(opts.trainer_dir or f"bftrainer-run-{stem}")
        self.trainer_id = opts.trainer_id or stem
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device = model_device(model)
        self.grad_scaler = grad_scaler
        self.comm = comm or make_comm(device=self.device)
        nodes = max(1, self.comm.size // max(1, self.comm.local_size))
        self.agent = PolluxAgent(
            self.trainer_id,
            self.limits,
            replicas_per_node=max(1, self.comm.size // nodes),
            lr_rule_name=opts.lr_rule,
        )
        self.probe = TorchGradientProbe(self.agent, model, optimizer)
        self.progress = RunProgress()
        self._pending: list[tuple[int, list[int]]] = []
        self._leaving = False
        self._lr_factor_set: float | None = None  # the factor the optimizer's LR has now
        self._last_fit_t = -math.inf
        self._cadence = RetuneCadence(self.limits, opts.retune)
        # This process's time in commits and in re-tunes (decisions and moves), for the
        # cost model's figures (benchmarks/runtime_speed.py).
        self.overhead_s = {"commit": 0.0, "retune": 0.0}
        self._move_out: tuple[int, int] | None = None  # rank 0's move for the next flags
        # on_commit announces a commit as done: it must be on disk by then. Otherwise
        # a thread writes it, and the step goes on.
        self._writer = CheckpointWriter() if on_commit is None else None
        self._reuse_snapshot: dict[str, Any] | None = None  # the commit's, for Horovod
        self._channel_writer: channel.ChannelWriter | None = None
        self.trainer_dir.mkdir(parents=True, exist_ok=True)
        self._checkpoint = self.trainer_dir / channel.CHECKPOINT
        self._stop_file = self.trainer_dir / channel.STOP_REQUEST
        self.stopped = False
        self._load_from_disk()

    # -- configuration at a reset --------------------------------------------------
    def _reset(self) -> None:
        """At the start and after every reset: agent's configuration, LR, step plan.

        Rank 0 decides and the others take its decision and its agent state: each rank
        times its own steps and samples its own gradient noise, so their agents drift
        apart between resets, and ranks that chose different batches would train on
        different samples.
        """
        comm = self.comm
        replicas = comm.size
        nodes = max(1, replicas // max(1, comm.local_size))
        # Rank 0 plans on the world as it is now: under Horovod it changes shape without
        # a new process (a grow onto a shared node's other slot adds a replica per node).
        self.agent.replicas_per_node = max(1, replicas // nodes)
        choice = None
        if comm.rank == 0:
            self.probe.flush()
            try:
                choice = self.agent.best_config(nodes)
            except NoFeasibleConfigError as e:
                logger.warning("agent: %s; using the base batch", e)
        if choice is not None:
            local, accum, source = choice.local_bsz, choice.accum_steps, "agent"
        else:
            try:
                local, accum = base_config(self.limits, replicas)
            except ValueError as e:
                raise RuntimeConfigError(str(e)) from None
            source = "base"
        if replicas > 1:
            mine = (nodes, local, accum, source, self.agent.state()) if comm.rank == 0 else None
            nodes, local, accum, source, agent_state = comm.broadcast_object(mine)
            if comm.rank != 0:
                self.agent.restore(agent_state)
                self.agent.replicas_per_node = max(1, replicas // nodes)
        self.progress.resets += 1
        now = time.perf_counter()
        self._last_commit_t = self._last_report_t = self._last_stop_check_t = now
        self._cadence.restart(self.sampler.epoch, now)
        self._move_out = None
        self._configure(nodes, local, accum, source)

    # -- the loop ------------------------------------------------------------------
    def run(self) -> dict[str, Any] | None:
        """Train until the work is done (returns the result) or a stop (returns None)."""
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            return self.comm.run(self._train, self)
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # SIGTERM reaches only the workers of the node being taken back (Slurm sends it
        # to the holder's steps on preemption): this worker leaves at the next step,
        # after everyone has committed; the others go on. Stopping the whole trainer is
        # the supervisor's stop request (stop.request), not a signal.
        self._leaving = True

    def _train(self) -> dict[str, Any] | None:
        self._reset()
        reducer = None
        if self.comm.size > 1:
            reducer = GradientReducer(self.params, self.comm, NUM_FLAGS, device=self.device)
        try:
            return self._steps(reducer)
        finally:
            if reducer is not None:
                reducer.close()

    def _steps(self, reducer: GradientReducer | None) -> dict[str, Any] | None:
        comm = self.comm
        rank, replicas = comm.rank, comm.size
        agent, sampler, p = self.agent, self.sampler, self.progress
        opts = self.opts
        cfg = agent.config
        lagged = None
        if reducer is not None:
            lagged = LaggedFlags(NUM_FLAGS, self.device, reducer.flags_dtype)
        track_ids = self.on_commit is not None
        every_steps = opts.commit_every_steps
        # The per-step path in locals: every attribute lookup saved is time the user's
        # step keeps. Nothing here reads the device: the plain loop does not either.
        work, clock = self.work_samples, time.perf_counter
        model, optimizer, loss_fn, fetch = self.model, self.optimizer, self.loss_fn, self.fetch
        after_backward, observe_step = self.probe.after_backward, agent.observe_step
        scaler = self.grad_scaler
        # Several processes: the .grad are views into the reducer's buckets, zeroed there.
        zero_grad = optimizer.zero_grad if reducer is None else reducer.zero_grad
        cadence, awaiting = self._cadence, False
        order_epoch, order = -1, cast(Any, None)  # looked up when the epoch changes
        while p.samples_done < work:
            t0 = clock()
            plan = sampler.plan(cfg.local_bsz, replicas, cfg.accum_steps, work - p.samples_done)
            zero_grad()
            bounds = sampler.micro_bounds(plan, rank)
            if plan.epoch != order_epoch:
                order_epoch, order = plan.epoch, self._order_of(plan.epoch)
            last = len(bounds) - 1
            for j, (a, b) in enumerate(bounds):
                if reducer is not None and j == last:
                    reducer.arm()  # the step's last backward() starts the buckets
                if b > a:  # sizes from the bounds: len() of a tensor costs a microsecond
                    loss = loss_fn(model, fetch(order[a:b]))
                    if b - a != plan.count:  # the step's mean over all its samples
                        loss = loss * ((b - a) / plan.count)
                    (loss if scaler is None else scaler.scale(loss)).backward()
            now = clock()
            # Decisions that depend on a clock, a file or a signal, as flags that ride
            # on the gradient all-reduce: every rank then acts on the same step.
            commit_due = stop = hosts_updated = leaving = 0.0
            move: tuple[int, int] | None = None
            if rank == 0:
                if now - self._last_commit_t >= opts.commit_every_s:
                    commit_due = 1.0
                if now - self._last_stop_check_t >= STOP_CHECK_EVERY_S:
                    self._last_stop_check_t = now
                    if self._stop_file.exists():
                        stop = 1.0
            # Read once: a SIGTERM that lands after this step's flags were agreed on is
            # acted on later, so the worker never leaves without the commit.
            leaving_here = self._leaving
            if leaving_here:
                leaving = 1.0
            if comm.hosts_updated:
                hosts_updated = 1.0
            if reducer is not None and lagged is not None:
                # Only rank 0's LR factor counts: the ranks' noise estimates differ, and
                # different learning rates would make their models drift apart.
                lr_mine = agent.lr_factor if rank == 0 else 0.0
                local_out, accum_out = self._move_out or (0, -1)
                self._move_out = None
                awaiting = local_out > 0  # no new decision before this one is agreed
                summed = reducer.finish(
                    (commit_due, stop, hosts_updated, leaving, lr_mine, local_out, accum_out + 1)
                )
                # Act on the previous step's agreed flags (their copy to the host ran
                # meanwhile); a commit asked for before the last commit is stale.
                agreed = lagged.exchange(summed, (p.step, leaving_here))
                commit_due = stop = hosts_updated = leaving = 0.0
                leaving_here = False
                if agreed is not None:
                    (commit_due, stop, hosts_updated, leaving, lr_factor, m, s1), tag = agreed
                    sent_step, leaving_here = tag
                    if sent_step < p.committed_step:
                        commit_due = 0.0
                    self._set_lr(lr_factor)
                    if m > 0:
                        move = (round(m), round(s1) - 1)
            if scaler is None:
                after_backward()
                optimizer.step()
            else:  # every rank holds the same sums: all skip an overflowing step alike
                scaler.unscale_(optimizer)
                after_backward()
                scaler.step(optimizer)
                scaler.update()
            sampler.advance(plan)
            p.step += 1
            p.samples_done += plan.count
            if track_ids:
                host = sampler.order(plan.epoch)
                mine = [int(i) for a, b in bounds for i in host[a:b]]
                self._pending.append((plan.epoch, mine))
            observe_step(clock() - t0)
            if replicas == 1:
                self._set_lr()
            if rank == 0 and now - self._last_report_t >= opts.report_every_s:
                self._report()
            done = p.samples_done >= work
            # A reset or a stop follows those flags: no re-tuning just before it.
            changing = done or stop or hosts_updated or leaving
            if not changing:
                if move is not None:  # rank 0's, agreed on: every rank moves now
                    self._move(move)
                    cfg = agent.config
                # Rank 0 decides outside the step's timing; its move rides on the next
                # step's flags (one process: it is taken at once).
                if (
                    rank == 0
                    and not awaiting
                    and self._move_out is None
                    and cadence.due(sampler.epoch, clock())
                ):
                    decided = self._retune()
                    if decided is not None and replicas == 1:
                        self._move(decided)
                        cfg = agent.config
                    else:
                        self._move_out = decided
            if (
                changing
                or commit_due
                or (every_steps is not None and p.step - p.committed_step >= every_steps)
            ):
                # Horovod: HostsUpdatedInterrupt, except on a rank leaving here
                self._commit(leaving=bool(leaving_here and not done), durable=bool(changing))
            if leaving_here and not done:
                logger.info("SIGTERM: leaving at step %d (committed)", p.step)
                comm.leave()
                raise WorkerLeaving(f"rank {rank} left at step {p.step} on SIGTERM")
            if leaving and not done:
                comm.regroup()  # another rank leaves at this commit
            if stop and not done:
                self.stopped = True
                logger.info("stopped at step %d (checkpointed)", p.step)
                return None
        return self._finish()

    def _order_of(self, epoch: int) -> Any:
        """The epoch's order, on the device when ``fetch`` wants the ids there."""
        if not self.device_ids:
            return self.sampler.order(epoch)
        if self._order[0] != epoch:
            host = self.sampler.order(epoch)
            self._order = (epoch, self.torch.from_numpy(host).to(self.device))
        return self._order[1]

    def _report(self) -> None:
        self._last_report_t = time.perf_counter()
        writer = self._writer_of_rank0
        if writer is not None:  # the probe's flush reads the device: rank 0 alone
            self.probe.flush()
            record = self.agent.metrics(refit=self._refit_due())
            writer.metrics(record, self.progress.samples_done, self.sampler.epoch)

    def _commit(self, leaving: bool = False, durable: bool = False) -> None:
        """Make the state durable: ids to ``on_commit``, checkpoint, in-memory copy.
        The checkpoint is written by a thread unless ``on_commit`` or ``durable`` (a
        stop, a reset or the end of the work follows) needs it on disk now. A rank
        ``leaving`` at this commit keeps no in-memory copy: a host change that arrives
        with its leave is the others' to act on (raised here, it made the leaver reset
        with them and leave a step later than the commit they resumed from)."""
        comm, p = self.comm, self.progress
        began = time.perf_counter()
        info = CommitInfo(p.committed_step, p.step, p.samples_done)
        if comm.size > 1:
            # Every rank's model must be the same bits (summed gradients, one LR from
            # rank 0): a checksum per commit turns a silent divergence into an error.
            gathered = comm.allgather_object((model_checksum(self.params), self._pending))
            checksums = [c for c, _ in gathered]
            if len(set(checksums)) > 1:
                raise ReplicaDivergenceError(
                    f"replicas' models differ at step {p.step}: checksums {checksums}"
                )
            info.ids = [entry for _, rank_entries in gathered for entry in rank_entries]
        else:
            info.ids = list(self._pending)
        self._pending = []
        p.committed_step = p.step
        writes = comm.rank == 0 and self.opts.checkpoint
        snap = self.snapshot() if writes or comm.backend == "horovod" else None
        if comm.rank == 0 and self.on_commit is not None:
            self.on_commit(info)
        if writes and snap is not None:
            if self._writer is None:
                save_checkpoint(snap, self._checkpoint)
            else:
                self._writer.submit(snap, self._checkpoint)
                if durable:
                    self._writer.wait()
        if comm.rank == 0:
            self._evaluate()
        if self._writer is None and comm.size > 1:
            # on_commit's promise: nobody keeps a commit that rank 0 may not have
            # written (it could die first).
            comm.broadcast_object(None)
        if not leaving:
            self._reuse_snapshot = snap
            try:
                comm.commit()
            finally:
                self._reuse_snapshot = None
        self._last_commit_t = time.perf_counter()
        self.overhead_s["commit"] += self._last_commit_t - began

    def report(self, value: float) -> None:
        """The trainer's metric, keyed by samples trained (not seconds: a resized trial
        compares fairly), for a search's pruner (docs/hpo.md); rank 0 writes it, fsynced."""
        value, p = finite_report(value, self.progress.samples_done), self.progress
        if (writer := self._writer_of_rank0) is not None:
            writer.report(value, p.samples_done, p.step, self.opts.trial)
            self._reported_samples = p.samples_done

    def _evaluate(self) -> None:
        """``evaluate(model)`` reported once per sample count (rank 0: commits, the end)."""
        if self.evaluate is not None and self._reported_samples != self.progress.samples_done:
            self.report(self.evaluate(self.model))

    def _finish(self) -> dict[str, Any]:
        self._wait_for_disk()
        p = self.progress
        result = {
            "trainer_id": self.trainer_id,
            "samples": p.samples_done,
            "steps": p.step,
            "resets": p.resets,
            "retunes": p.retunes,
            "batch_sizes": list(p.batch_sizes),
            "epochs": p.samples_done / self.num_samples,
        }
        writer = self._writer_of_rank0
        if writer is not None:
            self._evaluate()  # the final value, before result.json says done
            writer.metrics(self.agent.metrics(), p.samples_done, self.sampler.epoch)
            writer.result(result)
            print(strict_json.dumps(result, sort_keys=True), flush=True)
        return result
