"""The per-step bookkeeping a training script calls: the Pollux agent of one trainer.

The agent keeps what Pollux's goodput model needs and nothing framework-specific:

* step times per configuration (nodes, replicas, local batch, accumulation), as running
  means, so memory stays bounded however long the job runs;
* the gradient noise estimators (:mod:`bftrainer.trainers.gns`), fed with gradients or
  with their squared norms;
* the statistical progress in base-batch steps (the sum of the AdaScale gains);

and on demand fits the step-time model, builds the goodput model (best configuration per
node count, curve for the allocator), and produces the :class:`MetricsRecord` the
trainer reports. The core is numpy; ``TorchGradientProbe`` (``probe.py``) reads a torch
model's gradients, and torch is imported only when a probe is made.

Typical loop (one replica per node; Horovod averages ``.grad`` before the step)::

    agent = PolluxAgent("t1", BatchLimits(base_batch_size=64, max_batch_size=4096,
                                          max_local_bsz=512))
    agent.set_config(nodes=hvd.size(), local_bsz=64)
    probe = TorchGradientProbe(agent, model, optimizer)
    for x, y in loader:
        t0 = time.perf_counter()
        loss_fn(model(x), y).backward()
        optimizer.synchronize()  # Horovod: .grad is now the average over replicas
        probe.after_backward()  # probe.flush() before reading agent.pgns
        with optimizer.skip_synchronize():
            optimizer.step()
        optimizer.zero_grad()
        agent.observe_step(time.perf_counter() - t0)
        for g in optimizer.param_groups: g["lr"] = lr0 * agent.lr_factor
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bftrainer.trainers.efficiency import step_gain
from bftrainer.trainers.gns import (
    DEFAULT_SMOOTHING,
    GradientNoiseScale,
    Preconditioner,
    Vector,
    identity,
)
from bftrainer.trainers.goodput import (
    DEFAULT_SWITCH_GAIN,
    BatchLimits,
    GoodputConfig,
    GoodputModel,
    retune_choice,
)
from bftrainer.trainers.lr_scaling import LRScalingRule, lr_rule
from bftrainer.trainers.metrics import MetricsRecord
from bftrainer.trainers.throughput import StepObservation, ThroughputModel, fit_throughput

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

DEFAULT_WARMUP_STEPS = 1


class ConfigError(ValueError):
    """A trainer configuration the agent cannot use (names the value)."""


@dataclass(frozen=True)
class TrainerConfig:
    """What the trainer runs now: n nodes, K = n r replicas, local batch m, s accumulations."""

    nodes: int
    replicas: int
    local_bsz: int
    accum_steps: int

    @property
    def batch_size(self) -> int:
        return self.replicas * self.local_bsz * (self.accum_steps + 1)


class _RunningMean:
    """Count and mean of step times, O(1) memory; updated inline by ``observe_step``.

    The count is a float: a simulated trainer may report a fractional number of steps
    (:meth:`PolluxAgent.observe_steps`)."""

    __slots__ = ("count", "mean")

    def __init__(self) -> None:
        self.count = 0.0
        self.mean = 0.0


class PolluxAgent:
    """Per-trainer bookkeeping for goodput-driven batch sizes (Pollux's agent).

    ``limits`` are the user's batch limits and memory bound; ``replicas_per_node`` is
    how many data-parallel replicas run on each node (1 for one process per node).
    ``warmup_steps`` steps after every :meth:`set_config` are not timed (first steps are
    slow: allocation, caches). ``lr_rule_name`` names a rule of
    :mod:`bftrainer.trainers.lr_scaling` or is one. ``clock`` stamps the metrics records.
    """

    def __init__(
        self,
        trainer_id: str,
        limits: BatchLimits,
        *,
        replicas_per_node: int = 1,
        smoothing: float = DEFAULT_SMOOTHING,
        lr_rule_name: str | LRScalingRule = "adascale",
        warmup_steps: int = DEFAULT_WARMUP_STEPS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if replicas_per_node < 1:
            raise ConfigError(f"replicas_per_node must be >= 1, got {replicas_per_node}")
        if warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.trainer_id = trainer_id
        self.limits = limits
        self.replicas_per_node = replicas_per_node
        self.warmup_steps = warmup_steps
        self.lr_rule = lr_rule(lr_rule_name) if isinstance(lr_rule_name, str) else lr_rule_name
        self.gns = GradientNoiseScale(limits.base_batch_size, smoothing)
        self._clock = clock
        self._config: TrainerConfig | None = None
        self._times: dict[TrainerConfig, _RunningMean] = {}
        self._stats: _RunningMean | None = None  # the current configuration's entry
        self._batch_size = 0
        self._gain = 0.0  # base-batch steps per step at the current batch and PGNS
        self._gain_pgns: float | None = None
        self._lr_key: tuple[int, float | None] | None = None
        self._lr_factor = 1.0
        self._skip: float = 0  # warm-up steps left (fractional after observe_steps)
        self._dirty = False
        self._model: ThroughputModel | None = None
        self._fitted_configs: frozenset[TrainerConfig] = frozenset()
        self.steps: float = 0
        self.progress = 0.0
        self.last_step_time_s: float | None = None

    # -- configuration ---------------------------------------------------------
    def set_config(
        self, nodes: int, local_bsz: int, accum_steps: int = 0, replicas: int | None = None
    ) -> TrainerConfig:
        """Declare the configuration the next steps run (after every rescale);
        ``replicas`` default: nodes x replicas_per_node (else: slots of shared nodes)."""
        for name, value, low in (("nodes", nodes, 1), ("local_bsz", local_bsz, 1)):
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        if not isinstance(accum_steps, int) or accum_steps < 0:
            raise ConfigError(f"accum_steps must be an integer >= 0, got {accum_steps!r}")
        k = nodes * self.replicas_per_node if replicas is None else replicas
        if not isinstance(k, int) or k < nodes:
            raise ConfigError(f"replicas must be an integer >= nodes ({nodes}), got {k!r}")
        config = TrainerConfig(nodes, k, local_bsz, accum_steps)
        if config != self._config:
            self.gns.reset_pairing()  # a differenced pair must not straddle a rescale
        self._config = config
        self._stats = self._times.setdefault(config, _RunningMean())
        self._batch_size = config.batch_size
        self._gain = step_gain(self._batch_size, self.limits.base_batch_size, self.gns.pgns)
        self._gain_pgns = self.gns.pgns
        self._skip = self.warmup_steps
        return config

    @property
    def config(self) -> TrainerConfig:
        if self._config is None:
            raise ConfigError(f"trainer {self.trainer_id!r}: call set_config() before stepping")
        return self._config

    # -- per step --------------------------------------------------------------
    def observe_step(self, step_time_s: float) -> None:
        """Count one optimizer step of the current configuration and its wall time.

        Called every step, so it is kept to a few attribute updates: the step's gain is
        recomputed only when the PGNS changed, and the running mean is inlined.
        """
        stats = self._stats
        if stats is None:
            raise ConfigError(f"trainer {self.trainer_id!r}: call set_config() before stepping")
        if not 0.0 < step_time_s < math.inf:
            raise ConfigError(f"step_time_s must be finite > 0, got {step_time_s!r}")
        self.steps += 1
        self.last_step_time_s = step_time_s
        pgns = self.gns.pgns
        if pgns != self._gain_pgns:
            self._gain = step_gain(self._batch_size, self.limits.base_batch_size, pgns)
            self._gain_pgns = pgns
        self.progress += self._gain
        if self._skip > 0:
            self._skip -= 1
            return
        if not stats.count:
            self._first_timed()
        stats.count += 1
        stats.mean += (step_time_s - stats.mean) / stats.count
        self._dirty = True

    def observe_steps(self, count: float, mean_step_time_s: float) -> None:
        """Count ``count`` steps of the current configuration that took
        ``mean_step_time_s`` each on average: :meth:`observe_step` in bulk.

        For a driver that knows steps only by the interval (a simulated trainer, or a
        runtime that times a batch of steps at once); ``count`` may be fractional (the
        steps of a simulated interval). Warm-up steps still left after a
        :meth:`set_config` are counted but not timed, as one by one.
        """
        stats = self._stats
        if stats is None:
            raise ConfigError(f"trainer {self.trainer_id!r}: call set_config() before stepping")
        if not 0.0 < count < math.inf:
            raise ConfigError(f"count must be finite > 0, got {count!r}")
        if not 0.0 < mean_step_time_s < math.inf:
            raise ConfigError(f"mean_step_time_s must be finite > 0, got {mean_step_time_s!r}")
        self.steps += count
        self.last_step_time_s = mean_step_time_s
        pgns = self.gns.pgns
        if pgns != self._gain_pgns:
            self._gain = step_gain(self._batch_size, self.limits.base_batch_size, pgns)
            self._gain_pgns = pgns
        self.progress += self._gain * count
        timed = count - min(self._skip, count)
        self._skip = max(0.0, self._skip - count)
        if timed <= 0:
            return
        if not stats.count:
            self._first_timed()
        stats.count += timed
        stats.mean += (mean_step_time_s - stats.mean) * timed / stats.count
        self._dirty = True

    def _first_timed(self) -> None:
        """Keep configurations in the order first timed: the fit sees them in that order,
        whatever was declared and never run."""
        config = self.config
        self._times[config] = self._times.pop(config)

    def observe_gradients(
        self, groups: Sequence[Vector], preconditioner: Preconditioner = identity
    ) -> None:
        """This step's flat gradients, one per group of ``local_bsz`` samples.

        Groups are replicas or accumulation micro-batches; one group uses the
        differenced estimator against the previous step.
        """
        self.gns.observe(groups, self.config.local_bsz, preconditioner)

    def observe_gradient_norms(self, local_sqr_mean: float, total_sqr: float, groups: int) -> None:
        """Squared norms from K >= 2 groups (mean of local |g_k|^2, and |mean g_k|^2)."""
        self.gns.update_from_norms(local_sqr_mean, total_sqr, groups, self.config.local_bsz)

    def observe_consecutive_norms(self, sqr: float, dot_prev: float) -> None:
        """|g_t|^2 and g_t . g_{t-1} of whole steps' gradients (differenced estimator).

        The gradients are the ones the optimizer applies: averaged over all replicas and
        accumulation micro-steps, i.e. over the step's total batch M.
        """
        self.gns.update_from_consecutive(sqr, dot_prev, self.config.batch_size)

    # -- models ----------------------------------------------------------------
    @property
    def pgns(self) -> float | None:
        return self.gns.pgns

    @property
    def lr_factor(self) -> float:
        """Learning-rate factor for the current total batch (lr = lr0 * factor).

        Read every step: recomputed only when the PGNS or the configuration changed.
        """
        pgns = self.gns.pgns
        if self._lr_key != (self._batch_size, pgns):
            config = self.config
            self._lr_factor = self.lr_rule.factor(
                config.batch_size, self.limits.base_batch_size, pgns
            )
            self._lr_key = (config.batch_size, pgns)
        return self._lr_factor

    @property
    def mean_step_time_s(self) -> float | None:
        """Mean timed step of the current configuration (None before the first)."""
        stats = self._stats
        return stats.mean if stats is not None and stats.count else None

    def observations(self) -> list[StepObservation]:
        """Mean step time of every configuration timed so far."""
        return [
            StepObservation(c.nodes, c.replicas, c.local_bsz, c.accum_steps, s.mean)
            for c, s in self._times.items()
            if s.count
        ]

    def fit(self) -> ThroughputModel | None:
        """Refit the step-time model if new steps were timed; None before any."""
        if self._dirty:
            observations = self.observations()
            self._model = fit_throughput(observations)
            self._fitted_configs = frozenset(
                TrainerConfig(o.nodes, o.replicas, o.local_bsz, o.accum_steps) for o in observations
            )
            self._dirty = False
        return self._model

    @property
    def model(self) -> ThroughputModel | None:
        """The step-time model of the last :meth:`fit`, without refitting (None before)."""
        return self._model

    @property
    def new_configs(self) -> int:
        """Configurations timed that the last fit did not see.

        Pollux's simulator refits only when there is one; a driver that follows that
        rule calls :meth:`fit` then and reads the rest with ``refit=False``.
        """
        return sum(1 for c, s in self._times.items() if s.count and c not in self._fitted_configs)

    def goodput_model(self, *, refit: bool = True) -> GoodputModel | None:
        """The goodput model from the latest fit and PGNS; None before any timed step.

        ``refit=False`` uses the last fit as it is, even if steps were timed since.
        """
        model = self.fit() if refit else self._model
        if model is None:
            return None
        return GoodputModel(
            model, self.gns.pgns, self.limits, replicas_per_node=self.replicas_per_node
        )

    def best_config(self, nodes: int, *, refit: bool = True) -> GoodputConfig | None:
        """The local batch and accumulation to run on ``nodes`` nodes (None: no model yet)."""
        model = self.goodput_model(refit=refit)
        return None if model is None else model.best_config(nodes)

    def retune(
        self, switch_gain: float = DEFAULT_SWITCH_GAIN, *, refit: bool = True
    ) -> GoodputConfig | None:
        """The better configuration at the current size to move to now, or None to stay
        (Pollux re-tunes between rescales; the rule is :func:`goodput.retune_choice`)."""
        config = self.config
        model = self.goodput_model(refit=refit)
        if model is None:
            return None
        return retune_choice(
            model,
            config.nodes,
            config.replicas,
            config.local_bsz,
            config.accum_steps,
            switch_gain=switch_gain,
        )

    def state(self) -> dict[str, Any]:
        """What a restarted process needs to continue (JSON-able): the step-time means,
        the noise averages, and the step and progress counts.

        torchrun restarts every worker on a rescale; save this with the checkpoint and
        pass it to :meth:`restore` in the new process (built with the same limits).
        """
        return {
            "trainer_id": self.trainer_id,
            "steps": self.steps,
            "progress": self.progress,
            "times": [
                [c.nodes, c.replicas, c.local_bsz, c.accum_steps, st.count, st.mean]
                for c, st in self._times.items()
                if st.count
            ],
            "gns": self.gns.state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state`; the configuration must be set again."""
        if state.get("trainer_id") != self.trainer_id:
            raise ConfigError(
                f"state of trainer {state.get('trainer_id')!r} given to {self.trainer_id!r}"
            )
        self.steps = int(state["steps"])
        self.progress = float(state["progress"])
        self._times = {}
        for n, k, m, s, count, mean in state["times"]:
            stats = self._times[TrainerConfig(int(n), int(k), int(m), int(s))] = _RunningMean()
            stats.count, stats.mean = float(count), float(mean)
        self.gns.restore(state["gns"])
        self._config = self._stats = None
        self._dirty = bool(self._times)
        self._model = None
        self._fitted_configs = frozenset()

    def metrics(self, *, refit: bool = True) -> MetricsRecord:
        """The record the trainer reports (refits the step-time model first, unless
        ``refit=False``: then it carries the last fit)."""
        config = self.config
        return MetricsRecord(
            trainer_id=self.trainer_id,
            time_s=float(self._clock()),
            limits=self.limits,
            replicas_per_node=self.replicas_per_node,
            nodes=config.nodes,
            local_bsz=config.local_bsz,
            accum_steps=config.accum_steps,
            steps=int(self.steps),
            mean_step_time_s=self.mean_step_time_s,
            configs_seen=sum(1 for s in self._times.values() if s.count),
            progress=self.progress,
            grad_sqr=self.gns.grad_sqr,
            grad_var=self.gns.grad_var,
            throughput=self.fit() if refit else self._model,
            lr_rule=self.lr_rule.name,
            lr_factor=self.lr_factor,
        )
