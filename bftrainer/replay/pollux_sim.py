"""A replay driver whose trainers follow Pollux's application profiles (issue #4).

The plain driver (``simulator.py``) moves each trainer along a fixed throughput curve and
completes it after a number of samples. Here every trainer is one of Pollux's measured
applications (``../shared/data/pollux-sim/traces/<app>/``) and behaves as a live
bftrainer trainer with the Pollux agent would (docs/goodput-replay.md):

* **Truth.** A node runs ``replicas_per_node`` data-parallel replicas (default 1: a
  node is one GPU of the profile). A step of (n nodes, K = n r replicas, local batch m,
  s accumulation steps) takes the profile's step time at (n, K, m) plus s times its
  compute part, as Pollux's simulator counts it; outside the measured range, the step
  time of a fit to all the profile's measurements.
* **Statistical progress**, in base-batch steps: a step at total batch M adds
  ``step_gain(M)`` with the profile's gradient statistics of the epoch under way
  (Pollux's ``(var + sqr) / (var / scale + sqr)``). A job completes when its progress
  reaches its application's target, the last epoch's progress.
* **Observation and refits.** A trainer sees its step times as the truth times seeded
  log-normal noise, and its gradient statistics (through the library's smoothed noise
  estimator). It fits its step-time model whenever it has run a configuration its last
  fit had not seen (the rule of Pollux's simulator, at most once a minute), and reports
  goodput and throughput curves, built through the same ``MetricsRecord`` a live trainer
  sends, after each fit and every ``report_interval_s`` while it runs.
* **Batch size.** Adaptation on: the trainer runs ``best_config(n)`` of its goodput
  model at every rescale and report (Pollux's default before any fit: the smallest batch
  that gives every replica ``min_local_bsz``). Off: a fixed local batch per replica
  (weak scaling, as elastic Horovod jobs run), with accumulation to reach M0.
* **Costs.** A rescale or preemption costs R seconds at the old configuration, counted
  in samples (so U keeps the meaning of docs/replay.md) and in statistical progress.

The driver learns the clock from ``advance(trainers, now_s)``. Its reports are inputs of
the core loop (``CurveReport``, ``Completion``), never written into the trainers' records:
a reported curve asks the loop for a new decision, at most every ``redecide_every_s``
(``bftrainer.config.Config``). ``next_wakeup_s`` is the next completion and, with
adaptation on, the next report time of a running trainer, so that the loop wakes it to
re-pick its batch size between pool events; a wake-up is not an event (``events.csv``
records a step only when an input came or a decision was made).
"""

from __future__ import annotations

import csv
import logging
import math
import statistics
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bftrainer.idle_monitor.trace import format_time
from bftrainer.loop import Completion, CurveReport, Progress, TrainerState
from bftrainer.trainers.agent import TrainerConfig
from bftrainer.trainers.efficiency import step_gain
from bftrainer.trainers.gns import GradientNoiseScale, GradientSample
from bftrainer.trainers.goodput import BatchLimits, GoodputModel
from bftrainer.trainers.lr_scaling import lr_rule
from bftrainer.trainers.metrics import MetricsRecord
from bftrainer.trainers.pollux_profiles import (
    PolluxProfile,
    ProfileRangeError,
    load_profile,
)
from bftrainer.trainers.throughput import (
    StepObservation,
    ThroughputModel,
    fit_throughput,
    predict_step_time,
)

log = logging.getLogger(__name__)

DONE_RTOL = 1e-9
TIME_EPS_S = 1e-6  # clock comparisons: the loop stops exactly at the times asked for
LR_RULE = "adascale"
# Pollux's applications.py bounds yolov3's local batch below what placements.csv measured
# (memory); every other bound is the profile's own range.
MAX_LOCAL_BSZ = {"yolov3": 8}


class PolluxSimError(ValueError):
    """The driver was used or configured in a way it cannot simulate; names the value."""


@dataclass(frozen=True)
class PolluxJob:
    """What a job runs: its application and, without batch adaptation, its local batch.

    ``local_bsz`` is the samples per replica of one step when the batch size is not
    adapted (the total batch then grows with the replicas).
    """

    app: str
    local_bsz: int
    replicas_per_node: int = 1


@dataclass(frozen=True)
class PolluxSimOptions:
    """How the simulated trainers behave; defaults in one place.

    ``noise``: sigma of the log-normal factor on observed step times (one draw per
    trainer and interval between events). ``report_interval_s``: a trainer reports new
    curves at least this often while it runs. ``refit_interval_s``: it refits its
    step-time model at most this often (Pollux's scheduling interval).
    ``series_bin_s``: width of the efficiency time series.
    """

    batch_adapt: bool = True
    noise: float = 0.05
    report_interval_s: float = 60.0
    refit_interval_s: float = 60.0
    series_bin_s: float = 3600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise) and self.noise >= 0):
            raise PolluxSimError(f"noise is {self.noise!r}, expected a finite number >= 0")
        for name in ("report_interval_s", "series_bin_s", "refit_interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise PolluxSimError(f"{name} is {value!r}, expected a finite number > 0")


def app_limits(profile: PolluxProfile) -> BatchLimits:
    """Batch limits as Pollux's simulator sets them: M0 and M_max from the validation
    tables, the local batch range from placements.csv (yolov3: at most 8)."""
    lo, hi = profile.local_bsz_range
    return BatchLimits(
        base_batch_size=profile.base_batch_size,
        max_batch_size=max(profile.batch_sizes),
        max_local_bsz=max(lo, min(hi, MAX_LOCAL_BSZ.get(profile.app, hi))),
        min_local_bsz=lo,
    )


@dataclass(frozen=True)
class SegmentStats:
    """Gradient statistics within one epoch segment at one total batch, and its gain."""

    grad_sqr: float
    grad_var: float  # per sample (tr Sigma), the convention of bftrainer.trainers.gns
    gain: float  # base-batch steps per step


class SimApp:
    """The ground truth of one application: step times, gains, configurations.

    Statistical progress is split into segments at every epoch end of every validation
    table; the gradient statistics (hence the gain) are constant within a segment.
    """

    def __init__(self, profile: PolluxProfile, replicas_per_node: int = 1) -> None:
        if replicas_per_node < 1:
            raise PolluxSimError(f"replicas_per_node is {replicas_per_node}, expected >= 1")
        self.profile = profile
        self.name = profile.app
        self.replicas_per_node = replicas_per_node
        self.limits = app_limits(profile)
        self.target_progress = profile.target_progress
        self.boundaries = np.unique(
            np.concatenate([t.progress for t in profile.validation.values()])
        )
        self._times: dict[tuple[int, int, int], tuple[float, float, bool]] = {}
        self._stats: dict[tuple[int, int], SegmentStats] = {}
        self._after: dict[int, NDArray[np.float64]] = {}
        self._fallback: ThroughputModel | None = None

    # -- limits ------------------------------------------------------------------
    @cached_property
    def max_nodes(self) -> int:
        """The largest node count the profile measured at r replicas per node, within
        the batch limits (every replica needs ``min_local_bsz``)."""
        obs = self.profile.observations(include_scalability=True)
        measured = min(max(o.nodes for o in obs), max(o.replicas for o in obs) // self.r)
        feasible = self.limits.max_batch_size // (self.r * self.limits.min_local_bsz)
        return max(1, min(measured, feasible))

    @property
    def r(self) -> int:
        return self.replicas_per_node

    # -- configurations ------------------------------------------------------------
    def config(self, nodes: int, local_bsz: int) -> TrainerConfig:
        """``local_bsz`` samples per replica on ``nodes`` nodes, as Pollux's simulator
        turns a requested batch into one: at least ``min_local_bsz``, accumulate past
        ``max_local_bsz``, accumulate to reach M0, and stay within M_max (fewer micro-steps
        first, then a smaller local batch)."""
        lim = self.limits
        k = nodes * self.r
        if nodes < 1 or local_bsz < 1:
            raise PolluxSimError(f"{self.name}: nodes={nodes}, local_bsz={local_bsz}: not valid")
        local_bsz = max(local_bsz, lim.min_local_bsz)
        accum = -(-local_bsz // lim.max_local_bsz) - 1
        atomic = -(-local_bsz // (accum + 1))
        if k * atomic * (accum + 1) < lim.base_batch_size:
            accum = -(-lim.base_batch_size // (k * atomic)) - 1
        if k * atomic * (accum + 1) > lim.max_batch_size:
            accum = max(0, lim.max_batch_size // (k * atomic) - 1)
            atomic = min(atomic, lim.max_batch_size // (k * (accum + 1)))
        if atomic < lim.min_local_bsz:
            raise PolluxSimError(
                f"{self.name}: {nodes} node(s) x {self.r} replica(s) cannot keep "
                f"min_local_bsz {lim.min_local_bsz} within max_batch_size {lim.max_batch_size}"
            )
        return TrainerConfig(nodes, k, atomic, accum)

    def default_config(self, nodes: int) -> TrainerConfig:
        """Pollux's choice before any fit: the smallest batch >= M0 that gives every
        replica at least ``min_local_bsz``."""
        k = nodes * self.r
        batch = max(self.limits.base_batch_size, self.limits.min_local_bsz * k)
        return self.config(nodes, -(-batch // k))

    # -- truth -----------------------------------------------------------------------
    def step_time(self, config: TrainerConfig) -> tuple[float, bool]:
        """True seconds per optimizer step, and whether it came from the fallback fit."""
        key = (config.nodes, config.replicas, config.local_bsz)
        hit = self._times.get(key)
        if hit is None:
            try:
                st = self.profile.step_time(*key)
                hit = (st.step_time_s, st.step_time_s - st.sync_time_s, False)
            except ProfileRangeError:
                fit = self._fallback_fit()
                p = fit.params
                hit = (float(fit.step_time_s(*key)), p.alpha_grad_s + p.beta_grad_s * key[2], True)
            self._times[key] = hit
        step_s, compute_s, fallback = hit
        return step_s + config.accum_steps * compute_s, fallback

    def _fallback_fit(self) -> ThroughputModel:
        if self._fallback is None:
            self._fallback = fit_throughput(self.profile.observations(include_scalability=True))
            log.info("%s: step times outside the profile come from its fit", self.name)
        return self._fallback

    def segment(self, progress: float) -> int:
        return int(np.searchsorted(self.boundaries, progress, side="right"))

    def segment_end(self, segment: int) -> float:
        return float(self.boundaries[segment]) if segment < len(self.boundaries) else math.inf

    def steps_to_target(self, batch_size: int, progress: float) -> float:
        """Optimizer steps at ``batch_size`` from ``progress`` to the target."""
        seg = self.segment(progress)
        end = min(self.segment_end(seg), self.target_progress)
        head = max(end - progress, 0.0) / self.stats(batch_size, seg).gain
        after = self._after.get(batch_size)
        if after is None:
            after = self._after[batch_size] = self._steps_after(batch_size)
        return head + float(after[seg])

    def _steps_after(self, batch_size: int) -> NDArray[np.float64]:
        """after[s]: steps at ``batch_size`` from the end of segment s to the target."""
        starts = np.concatenate(([0.0], self.boundaries))
        ends = np.minimum(np.append(self.boundaries, np.inf), self.target_progress)
        lengths = np.maximum(ends - starts, 0.0)
        steps = np.zeros(len(lengths))
        for i in np.flatnonzero(lengths > 0):
            g = self.profile.grad_stats(batch_size, float(starts[i]))
            steps[i] = lengths[i] / step_gain(batch_size, self.limits.base_batch_size, g.pgns)
        return np.append(np.cumsum(steps[::-1])[::-1][1:], 0.0)

    def stats(self, batch_size: int, segment: int) -> SegmentStats:
        """Gradient statistics and gain of a step at ``batch_size`` in ``segment``."""
        key = (batch_size, segment)
        hit = self._stats.get(key)
        if hit is None:
            progress = 0.0 if segment == 0 else float(self.boundaries[segment - 1])
            g = self.profile.grad_stats(batch_size, progress)
            gain = step_gain(batch_size, self.limits.base_batch_size, g.pgns)
            hit = SegmentStats(g.grad_sqr, g.grad_var_per_sample, gain)
            self._stats[key] = hit
        return hit


@lru_cache(maxsize=64)
def sim_app(app: str, data_dir: Path, replicas_per_node: int = 1) -> SimApp:
    """One :class:`SimApp` per application, data directory and r, per process."""
    return SimApp(load_profile(app, data_dir), replicas_per_node)


@dataclass
class _Bin:
    trainer_s: float = 0.0
    node_s: float = 0.0
    samples: float = 0.0
    statistical_samples: float = 0.0
    efficiency_s: float = 0.0
    batch_s: float = 0.0


@dataclass
class _Trainer:
    """The simulated trainer's own state: what it runs, saw, fitted and achieved."""

    spec: PolluxJob
    app: SimApp
    rng: np.random.Generator
    gns: GradientNoiseScale
    config: TrainerConfig | None = None
    progress: float = 0.0
    # Configuration -> [steps, mean observed step time], as the agent's running means.
    seen: dict[TrainerConfig, list[float]] = field(default_factory=dict)
    fitted: frozenset[TrainerConfig] = frozenset()
    model: ThroughputModel | None = None
    next_check_s: float = math.inf  # next refit-and-report check while it runs
    last_fit_s: float = -math.inf
    refits: int = 0
    reports: int = 0
    steps: float = 0.0
    samples: float = 0.0
    statistical_samples: float = 0.0
    run_s: float = 0.0
    efficiency_s: float = 0.0
    batch_s: float = 0.0
    fallback_s: float = 0.0
    model_error_sum: float = 0.0
    model_error_n: int = 0
    finished_s: float | None = None
    configs: set[TrainerConfig] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return self.progress >= self.app.target_progress * (1 - DONE_RTOL)


@dataclass(frozen=True)
class PolluxReport:
    """What a replay with :class:`PolluxSimDriver` adds to the plain outputs (plain data,
    so it travels between processes)."""

    options: dict[str, Any]
    series: list[dict[str, Any]]
    trainers: dict[str, dict[str, Any]]
    summary: dict[str, Any]


class PolluxSimDriver:
    """The :class:`bftrainer.loop.TrainerDriver` of Pollux-profiled trainers.

    ``jobs`` maps job id to what it runs (``pollux_workload.py`` builds both the
    ``JobSpec`` list and this map); ``data_dir`` holds ``traces/<app>/``.
    """

    def __init__(
        self,
        jobs: Mapping[str, PolluxJob],
        data_dir: Path,
        options: PolluxSimOptions | None = None,
    ) -> None:
        self.jobs = dict(jobs)
        self.data_dir = Path(data_dir)
        self.options = options or PolluxSimOptions()
        self._trainers: dict[str, _Trainer] = {}
        self._now_s: float | None = None
        self._origin_s: float | None = None
        self._bins: dict[int, _Bin] = {}
        self._completed: set[str] = set()
        self._lr = lr_rule(LR_RULE)

    # -- the TrainerDriver protocol ----------------------------------------------------
    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        if self._now_s is None:
            self._now_s = self._origin_s = now_s
        t0 = self._now_s
        dt_s = now_s - t0
        total = 0.0
        running = []
        for t in trainers:
            tr = self._trainer(t)
            if tr.config is None or tr.done:
                continue
            if dt_s > 0:
                total += self._integrate(t, tr, t0, dt_s)
            running.append((t, tr))
        self._now_s = now_s
        reports: list[CurveReport | Completion] = []
        for t, tr in running:
            if not tr.done:
                reports.extend(self._refit_and_report(t, tr, now_s))
        for t in trainers:
            tr = self._trainer(t)
            if tr.done and t.id not in self._completed:
                self._completed.add(t.id)
                reports.append(Completion(t.id))
        return Progress(total, tuple(reports))

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        tr = self._trainer(trainer)
        cost = self._charge(tr, trainer.job.rescale_down_s)
        trainer.preemption_cost_samples += cost
        self._set_config(trainer, tr, len(trainer.nodes))
        return cost

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        tr = self._trainer(trainer)
        old, new = len(trainer.nodes), len(nodes)
        if new == old:
            return 0.0
        seconds = trainer.job.rescale_up_s if new > old else trainer.job.rescale_down_s
        cost = self._charge(tr, seconds)
        trainer.rescale_cost_samples += cost
        if old:
            trainer.rescales += 1
        self._set_config(trainer, tr, new)
        return cost

    def cancel(self, trainer: TrainerState) -> None:
        tr = self._trainers.get(trainer.id)
        if tr is not None:
            tr.config = None
            tr.next_check_s = math.inf

    def next_wakeup_s(self, trainers: Sequence[TrainerState], now_s: float) -> float:
        """The next completion at current rates and, adapting, the next report."""
        best = math.inf
        for t in trainers:
            tr = self._trainer(t)
            if tr.config is not None and not tr.done:
                done_s = now_s + self._time_to_target(tr)
                if done_s <= now_s:
                    # Less than the clock's resolution left (rounding of earlier steps):
                    # it is done now, or the loop would wait for it forever.
                    tr.progress = tr.app.target_progress
                    tr.finished_s = now_s
                best = min(best, done_s)
                if self.options.batch_adapt and tr.next_check_s > now_s:
                    best = min(best, tr.next_check_s)  # wake up to re-pick the batch size
        return best

    # -- progress ------------------------------------------------------------------------
    def _trainer(self, trainer: TrainerState) -> _Trainer:
        tr = self._trainers.get(trainer.id)
        if tr is None:
            spec = self.jobs.get(trainer.id)
            if spec is None:
                raise PolluxSimError(f"trainer {trainer.id!r} is not in the Pollux workload")
            app = sim_app(spec.app, self.data_dir, spec.replicas_per_node)
            seed = np.random.SeedSequence([self.options.seed, zlib.crc32(trainer.id.encode())])
            tr = _Trainer(
                spec=spec,
                app=app,
                rng=np.random.default_rng(seed),
                gns=GradientNoiseScale(app.limits.base_batch_size),
            )
            self._trainers[trainer.id] = tr
        return tr

    def _rates(self, tr: _Trainer) -> tuple[float, float]:
        """(samples/s, base-batch steps/s) of the current configuration, now."""
        assert tr.config is not None
        step_s, _ = tr.app.step_time(tr.config)
        gain = tr.app.stats(tr.config.batch_size, tr.app.segment(tr.progress)).gain
        return tr.config.batch_size / step_s, gain / step_s

    def _charge(self, tr: _Trainer, seconds: float) -> float:
        """R seconds at the current configuration: samples lost; progress lost too."""
        if tr.config is None or tr.done or seconds <= 0:
            return 0.0
        samples_sps, progress_ps = self._rates(tr)
        tr.progress = max(0.0, tr.progress - seconds * progress_ps)
        return seconds * samples_sps

    def _time_to_target(self, tr: _Trainer) -> float:
        assert tr.config is not None
        step_s, _ = tr.app.step_time(tr.config)
        return step_s * tr.app.steps_to_target(tr.config.batch_size, tr.progress)

    def _integrate(self, t: TrainerState, tr: _Trainer, t0_s: float, dt_s: float) -> float:
        """Run ``tr`` at its configuration from ``t0_s`` for ``dt_s`` (or to its target)."""
        assert tr.config is not None
        app, cfg = tr.app, tr.config
        m, m0 = cfg.batch_size, app.limits.base_batch_size
        step_s, fallback = app.step_time(cfg)
        samples_sps = m / step_s
        now, left, seg = t0_s, dt_s, app.segment(tr.progress)
        ran_s = 0.0
        while left > 0 and not tr.done:
            st = app.stats(m, seg)
            rate = st.gain / step_s
            end = min(app.segment_end(seg), app.target_progress)
            need = (end - tr.progress) / rate
            used = min(need, left)
            if need <= left:
                tr.progress, seg = end, seg + 1
            else:
                tr.progress += rate * used
            if used > 0:
                efficiency = st.gain * m0 / m
                tr.gns.update(GradientSample(st.grad_sqr, st.grad_var, m), used * samples_sps)
                tr.statistical_samples += rate * used * m0
                tr.efficiency_s += efficiency * used
                self._bin(now, used, cfg.nodes, samples_sps, rate * m0, efficiency, m)
            now += used
            left -= used
            ran_s += used
        if tr.done and tr.finished_s is None:
            tr.progress = app.target_progress
            tr.finished_s = now
        steps = ran_s / step_s
        samples = samples_sps * ran_s
        t.processed_samples += samples
        tr.samples += samples
        tr.steps += steps
        tr.run_s += ran_s
        tr.batch_s += m * ran_s
        if fallback:
            tr.fallback_s += ran_s
        if steps > 0:
            self._observe(tr, cfg, step_s, steps)
        return samples

    def _observe(self, tr: _Trainer, cfg: TrainerConfig, step_s: float, steps: float) -> None:
        """Fold the interval's mean step time, as the trainer measured it, into its means."""
        seen = step_s * math.exp(self.options.noise * float(tr.rng.standard_normal()))
        entry = tr.seen.setdefault(cfg, [0.0, 0.0])
        entry[0] += steps
        entry[1] += (seen - entry[1]) * steps / entry[0]

    def _bin(
        self,
        t0_s: float,
        duration_s: float,
        nodes: int,
        samples_sps: float,
        statistical_sps: float,
        efficiency: float,
        batch_size: int,
    ) -> None:
        """Spread one constant-rate stretch over the time-series bins it covers."""
        origin = self._origin_s if self._origin_s is not None else t0_s
        width = self.options.series_bin_s
        t, end = t0_s, t0_s + duration_s
        while t < end:
            k = int((t - origin) // width)
            stop = min(end, origin + (k + 1) * width)
            d = stop - t
            b = self._bins.setdefault(k, _Bin())
            b.trainer_s += d
            b.node_s += nodes * d
            b.samples += samples_sps * d
            b.statistical_samples += statistical_sps * d
            b.efficiency_s += efficiency * d
            b.batch_s += batch_size * d
            if stop <= t:  # float guard: never loop on a zero-width step
                break
            t = stop

    # -- the trainer's own model ---------------------------------------------------------
    def _refit(self, tr: _Trainer, now_s: float) -> bool:
        """Fit the step-time model if a configuration was run that the last fit missed
        (at most once every ``refit_interval_s`` after the first fit)."""
        if not tr.seen or tr.fitted.issuperset(tr.seen):
            return False
        if (
            tr.model is not None
            and now_s - tr.last_fit_s < self.options.refit_interval_s - TIME_EPS_S
        ):
            return False
        obs = [
            StepObservation(c.nodes, c.replicas, c.local_bsz, c.accum_steps, s[1])
            for c, s in tr.seen.items()
        ]
        tr.model = fit_throughput(obs)
        tr.fitted = frozenset(tr.seen)
        tr.last_fit_s = now_s
        tr.refits += 1
        return True

    def _record(self, t: TrainerState, tr: _Trainer, now_s: float) -> MetricsRecord:
        """The metrics record the live agent would send (the allocator's input)."""
        cfg = tr.config
        assert cfg is not None
        m0 = tr.app.limits.base_batch_size
        entry = tr.seen.get(cfg)
        return MetricsRecord(
            trainer_id=t.id,
            time_s=now_s,
            limits=tr.app.limits,
            replicas_per_node=tr.app.r,
            nodes=cfg.nodes,
            local_bsz=cfg.local_bsz,
            accum_steps=cfg.accum_steps,
            steps=int(tr.steps),
            mean_step_time_s=entry[1] if entry else None,
            configs_seen=len(tr.seen),
            progress=tr.progress,
            grad_sqr=tr.gns.grad_sqr,
            grad_var=tr.gns.grad_var,
            throughput=tr.model,
            lr_rule=self._lr.name,
            lr_factor=self._lr.factor(cfg.batch_size, m0, tr.gns.pgns),
        )

    def _goodput_model(self, t: TrainerState, tr: _Trainer, now_s: float) -> GoodputModel | None:
        self._refit(tr, now_s)
        if tr.model is None or tr.config is None:
            return None
        return self._record(t, tr, now_s).goodput_model()

    def _refit_and_report(self, t: TrainerState, tr: _Trainer, now_s: float) -> list[CurveReport]:
        """After a refit, or when a check is due: report curves and (adapting) re-pick the
        batch size, as the live agent does on its reporting timer."""
        refitted = self._refit(tr, now_s)
        if not refitted and now_s < tr.next_check_s - TIME_EPS_S:
            return []
        tr.next_check_s = now_s + self.options.report_interval_s
        if tr.model is None or tr.config is None:
            return []
        gm = self._record(t, tr, now_s).goodput_model()
        goodput, throughput = self._curves(t, tr, gm)
        tr.reports += 1
        true_s, _ = tr.app.step_time(tr.config)
        predicted = float(
            tr.model.step_time_s(
                tr.config.nodes, tr.config.replicas, tr.config.local_bsz, tr.config.accum_steps
            )
        )
        tr.model_error_sum += abs(predicted / true_s - 1)
        tr.model_error_n += 1
        if self.options.batch_adapt:
            best = gm.best_config(tr.config.nodes)
            tr.config = TrainerConfig(best.nodes, best.replicas, best.local_bsz, best.accum_steps)
            tr.configs.add(tr.config)
        return [
            CurveReport(t.id, "goodput", goodput),
            CurveReport(t.id, "throughput", throughput),
        ]

    def _curves(
        self, t: TrainerState, tr: _Trainer, gm: GoodputModel
    ) -> tuple[tuple[tuple[float, float], ...], tuple[tuple[float, float], ...]]:
        """(goodput, throughput) breakpoints over 1..n_max of what the trainer would run,
        flat past the model's exploration cap, as the allocator takes them."""
        n_max = t.job.n_max
        limit = gm.node_limit(1, n_max)
        nodes = list(range(1, limit + 1))
        if self.options.batch_adapt:
            goodput = [(float(n), float(v)) for n, v in gm.curve(1, n_max)]
            configs = gm.best_configs(nodes)
            thr = [0.0 if c is None else c.throughput_sps for c in configs]
        else:
            cfgs = [tr.app.config(n, tr.spec.local_bsz) for n in nodes]
            n_arr = np.array([c.nodes for c in cfgs])
            k_arr = np.array([c.replicas for c in cfgs])
            m_arr = np.array([c.local_bsz for c in cfgs])
            s_arr = np.array([c.accum_steps for c in cfgs])
            batch = np.array([c.batch_size for c in cfgs], dtype=float)
            step_s = predict_step_time(gm.params, n_arr, k_arr, m_arr, s_arr)
            thr = [float(v) for v in batch / step_s]
            good = gm.goodput(n_arr, m_arr, s_arr)
            goodput = [(float(n), float(v)) for n, v in zip(nodes, good, strict=True)]
            if limit < n_max:
                goodput.append((float(n_max), goodput[-1][1]))
        throughput = [(float(n), float(v)) for n, v in zip(nodes, thr, strict=True)]
        if limit < n_max:
            throughput.append((float(n_max), throughput[-1][1]))
        return tuple(goodput), tuple(throughput)

    def _set_config(self, t: TrainerState, tr: _Trainer, nodes: int) -> None:
        """The configuration to run on ``nodes`` nodes (None when it holds none)."""
        if nodes <= 0 or tr.done:
            tr.config = None
            tr.next_check_s = math.inf
            return
        now = self._now_s if self._now_s is not None else 0.0
        # A live agent refits once it has timed some steps of the new configuration.
        tr.next_check_s = now + self.options.refit_interval_s
        if not self.options.batch_adapt:
            tr.config = tr.app.config(nodes, tr.spec.local_bsz)
        else:
            gm = self._goodput_model(t, tr, now)
            if gm is None:
                tr.config = tr.app.default_config(nodes)
            else:
                best = gm.best_config(nodes)
                tr.config = TrainerConfig(
                    best.nodes, best.replicas, best.local_bsz, best.accum_steps
                )
        tr.configs.add(tr.config)

    # -- results -------------------------------------------------------------------------
    def report(self) -> PolluxReport:
        """The efficiency time series, per-trainer statistics and a summary."""
        width = self.options.series_bin_s
        origin = self._origin_s or 0.0
        end = self._now_s or origin
        series = []
        for k in sorted(self._bins):
            b = self._bins[k]
            start = origin + k * width
            length = max(min(width, end - start), 1e-9)
            series.append(
                {
                    "start": format_time(start),
                    "hours": k * width / 3600,
                    "running_trainers": b.trainer_s / length,
                    "nodes": b.node_s / length,
                    "samples_processed": b.samples,
                    "statistical_samples": b.statistical_samples,
                    "efficiency_samples": _ratio(b.statistical_samples, b.samples),
                    "efficiency_mean": _ratio(b.efficiency_s, b.trainer_s),
                    "mean_batch_size": _ratio(b.batch_s, b.trainer_s),
                    "goodput_sps": b.statistical_samples / length,
                }
            )
        trainers = {
            jid: {
                "app": tr.app.name,
                "target_progress": tr.app.target_progress,
                "progress": tr.progress,
                "finished_s": tr.finished_s,
                "run_s": tr.run_s,
                "steps": tr.steps,
                "samples_processed": tr.samples,
                "statistical_samples": tr.statistical_samples,
                "efficiency": _ratio(tr.efficiency_s, tr.run_s),
                "mean_batch_size": _ratio(tr.batch_s, tr.run_s),
                "configs_run": len(tr.configs),
                "refits": tr.refits,
                "reports": tr.reports,
                "fallback_share": _ratio(tr.fallback_s, tr.run_s),
                "model_error": _ratio(tr.model_error_sum, tr.model_error_n),
                "pgns": tr.gns.pgns,
            }
            for jid, tr in self._trainers.items()
        }
        run_s = sum(tr.run_s for tr in self._trainers.values())
        samples = sum(tr.samples for tr in self._trainers.values())
        errors = [
            tr.model_error_sum / tr.model_error_n
            for tr in self._trainers.values()
            if tr.model_error_n
        ]
        summary = {
            "batch_adapt": self.options.batch_adapt,
            "statistical_samples": sum(tr.statistical_samples for tr in self._trainers.values()),
            "statistical_efficiency": _ratio(
                sum(tr.statistical_samples for tr in self._trainers.values()), samples
            ),
            "mean_statistical_efficiency": _ratio(
                sum(tr.efficiency_s for tr in self._trainers.values()), run_s
            ),
            "refits": sum(tr.refits for tr in self._trainers.values()),
            "reports": sum(tr.reports for tr in self._trainers.values()),
            "fallback_time_share": _ratio(
                sum(tr.fallback_s for tr in self._trainers.values()), run_s
            ),
            "mean_model_error": statistics.fmean(errors) if errors else None,
        }
        return PolluxReport(asdict(self.options), series, trainers, summary)


@dataclass(frozen=True)
class PolluxDriverFactory:
    """Makes a fresh driver for each replay; plain data, so it can go to a worker process."""

    jobs: tuple[tuple[str, PolluxJob], ...]
    data_dir: Path
    options: PolluxSimOptions = PolluxSimOptions()

    def __call__(self) -> PolluxSimDriver:
        return PolluxSimDriver(dict(self.jobs), self.data_dir, self.options)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


# -- outputs of a replay with this driver ----------------------------------------------------
def completion_summary(trainers: Sequence[TrainerState], end_s: float) -> dict[str, Any]:
    """Job completion times (submission to completion): mean and tail over completed jobs,
    and the mean with unfinished jobs counted until ``end_s`` (a lower bound)."""
    done = sorted(t.finished_s - t.job.submit_s for t in trainers if t.finished_s is not None)
    censored = [
        (t.finished_s if t.finished_s is not None else end_s) - t.job.submit_s for t in trainers
    ]

    def pct(q: float) -> float | None:
        return float(np.percentile(done, q)) if done else None

    return {
        "jobs_completed": len(done),
        "jobs_arrived": len(trainers),
        "mean_jct_s": statistics.fmean(done) if done else None,
        "median_jct_s": pct(50),
        "p95_jct_s": pct(95),
        "p99_jct_s": pct(99),
        "max_jct_s": done[-1] if done else None,
        "mean_jct_censored_s": statistics.fmean(censored) if censored else None,
    }


def pollux_summary(
    trainers: Sequence[TrainerState], end_s: float, report: PolluxReport
) -> dict[str, Any]:
    """The fields a Pollux replay adds to ``summary.json``."""
    return {**completion_summary(trainers, end_s), **report.summary}


SERIES_COLUMNS = (
    "start",
    "hours",
    "running_trainers",
    "nodes",
    "samples_processed",
    "statistical_samples",
    "efficiency_samples",
    "efficiency_mean",
    "mean_batch_size",
    "goodput_sps",
)
TRAINER_COLUMNS = (
    "id",
    "app",
    "submit",
    "finished",
    "jct_s",
    "progress",
    "target_progress",
    "efficiency",
    "mean_batch_size",
    "configs_run",
    "refits",
    "reports",
    "rescales",
    "fallback_share",
    "model_error",
    "pgns",
)


def write_pollux_outputs(
    trainers: Sequence[TrainerState], report: PolluxReport, out_dir: Path
) -> None:
    """``efficiency.csv`` (the time series), ``pollux_trainers.csv`` and
    ``efficiency.png`` in ``out_dir``, beside the plain replay's files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "efficiency.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(SERIES_COLUMNS))
        w.writeheader()
        for row in report.series:
            w.writerow({k: _cell(row[k]) for k in SERIES_COLUMNS})
    with (out_dir / "pollux_trainers.csv").open("w", newline="") as f:
        w2 = csv.writer(f)
        w2.writerow(TRAINER_COLUMNS)
        for t in trainers:
            r = report.trainers.get(t.id, {})
            jct = t.finished_s - t.job.submit_s if t.finished_s is not None else None
            w2.writerow(
                [
                    t.id,
                    r.get("app", t.job.model),
                    format_time(t.job.submit_s),
                    format_time(t.finished_s) if t.finished_s is not None else "",
                    _cell(jct),
                    _cell(r.get("progress", 0.0)),
                    _cell(r.get("target_progress")),
                    _cell(r.get("efficiency")),
                    _cell(r.get("mean_batch_size")),
                    r.get("configs_run", 0),
                    r.get("refits", 0),
                    r.get("reports", 0),
                    t.rescales,
                    _cell(r.get("fallback_share")),
                    _cell(r.get("model_error")),
                    _cell(r.get("pgns")),
                ]
            )
    plot_efficiency([("", report)], out_dir / "efficiency.png")


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else ""
    return value


def plot_efficiency(runs: Sequence[tuple[str, PolluxReport]], path: Path) -> None:
    """Statistical efficiency over time: the mean over running trainers, and the share of
    processed samples that counted (samples-weighted), one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    for label, rep in runs:
        hours = [r["hours"] for r in rep.series]
        for ax, key in zip(axes, ("efficiency_mean", "efficiency_samples"), strict=True):
            values = [math.nan if r[key] is None else r[key] for r in rep.series]
            ax.plot(hours, values, lw=1.2, label=label or None)
    axes[0].set_ylabel("mean efficiency\nof running trainers")
    axes[1].set_ylabel("useful share\nof samples")
    axes[1].set_xlabel("hours since the replay started")
    for ax in axes:
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    if any(label for label, _ in runs):
        axes[0].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_completion(runs: Sequence[tuple[str, Sequence[TrainerState]]], path: Path) -> None:
    """CDF of job completion times (hours), one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, trainers in runs:
        jct = sorted(
            (t.finished_s - t.job.submit_s) / 3600 for t in trainers if t.finished_s is not None
        )
        if jct:
            frac = np.arange(1, len(jct) + 1) / len(trainers)
            ax.step(jct, frac, where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs completed")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pollux_table(runs: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """A short table of the statistical results, one column per run (summary dicts)."""

    def hours(v: float | None) -> str:
        return "-" if v is None else f"{v / 3600:.2f} h"

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    rows: list[tuple[str, Any]] = [
        ("run", lambda s, label: label),
        ("jobs done", lambda s, label: f"{s['jobs_completed']}/{s['jobs_arrived']}"),
        ("mean JCT", lambda s, label: hours(s["mean_jct_s"])),
        ("median JCT", lambda s, label: hours(s["median_jct_s"])),
        ("p95 JCT", lambda s, label: hours(s["p95_jct_s"])),
        ("p99 JCT", lambda s, label: hours(s["p99_jct_s"])),
        ("stat. efficiency", lambda s, label: num(s["mean_statistical_efficiency"])),
        ("useful share", lambda s, label: num(s["statistical_efficiency"])),
        ("refits", lambda s, label: f"{s['refits']:,}"),
    ]
    table = [[name] + [fmt(s, label) for label, s in runs] for name, fmt in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in table
    )
