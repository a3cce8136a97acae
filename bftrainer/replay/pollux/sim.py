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
* **Observation and refits.** Every simulated trainer drives a real
  :class:`~bftrainer.trainers.agent.PolluxAgent`, as a live trainer does: it tells the
  agent the steps of each interval and their mean time as it measured it (the truth
  times seeded log-normal noise, ``observe_steps``), and feeds the agent's noise
  estimator with the profile's gradient statistics. The agent refits its step-time
  model whenever the trainer has run a configuration the last fit had not seen (the
  rule of Pollux's simulator, at most once a minute), and its ``MetricsRecord``, the
  one a live trainer sends, gives the goodput and throughput curves reported after
  each fit and every ``report_interval_s`` while it runs.
* **Batch size.** Adaptation on: the trainer runs ``best_config(n)`` of its goodput
  model at every rescale and report (Pollux's default before any fit: the smallest batch
  that gives every replica ``min_local_bsz``). Off: a fixed local batch per replica
  (weak scaling, as elastic Horovod jobs run), with accumulation to reach M0.
* **Costs.** A rescale or preemption costs R seconds at the old configuration, counted
  in samples (so U keeps the meaning of docs/replay.md) and in statistical progress.

The applications' truth is ``pollux_app.py``; the options, a trainer's record and the
report ``pollux_trainer.py``; the curves a trainer reports ``pollux_curves.py``; the
efficiency series ``pollux_series.py``; outputs and plots ``pollux_output.py`` and
``pollux_plots.py``.

The driver learns the clock from ``advance(trainers, now_s)``. Its reports are inputs of
the core loop (``CurveReport``, ``Completion``), never written into the trainers' records:
a reported curve asks the loop for a new decision, at most every ``redecide_every_s``
(``bftrainer.policies.config.Config``). ``next_wakeup_s`` is the next completion and, with
adaptation on, the next report time of a running trainer, so that the loop wakes it to
re-pick its batch size between pool events; a wake-up is not an event (``events.csv``
records a step only when an input came or a decision was made).
"""

from __future__ import annotations

import logging
import math
import statistics
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bftrainer.loop import Completion, Curve, CurveReport, Progress, TrainerState
from bftrainer.policies.registry import spread_metric
from bftrainer.replay.pollux.app import PolluxJob, PolluxSimError, sim_app
from bftrainer.replay.pollux.curves import best_at, node_curves, slot_curves
from bftrainer.replay.pollux.series import EfficiencySeries, ratio
from bftrainer.replay.pollux.trainer import PolluxReport, PolluxSimOptions, SimTrainer
from bftrainer.trainers.agent import PolluxAgent, TrainerConfig
from bftrainer.trainers.gns import GradientSample
from bftrainer.trainers.goodput import (
    GoodputConfig,
    GoodputModel,
    retune_choice,
)
from bftrainer.trainers.retune_cadence import RetuneCadence

log = logging.getLogger(__name__)

TIME_EPS_S = 1e-6  # clock comparisons: the loop stops exactly at the times asked for
LR_RULE = "adascale"

__all__ = [
    "PolluxDriverFactory",
    "PolluxJob",
    "PolluxReport",
    "PolluxSimDriver",
    "PolluxSimError",
    "PolluxSimOptions",
]


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
        self._trainers: dict[str, SimTrainer] = {}
        self._now_s: float | None = None
        self._series = EfficiencySeries(self.options.series_bin_s)
        self._completed: set[str] = set()

    # -- the TrainerDriver protocol ----------------------------------------------------
    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        if self._now_s is None:
            self._now_s = self._series.origin_s = now_s
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
        self._set_config(trainer, tr, trainer.nodes)
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
        self._set_config(trainer, tr, nodes)
        return cost

    def cancel(self, trainer: TrainerState) -> None:
        tr = self._trainers.get(trainer.id)
        if tr is not None:
            tr.run(None)
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
    def _trainer(self, trainer: TrainerState) -> SimTrainer:
        tr = self._trainers.get(trainer.id)
        if tr is None:
            spec = self.jobs.get(trainer.id)
            if spec is None:
                raise PolluxSimError(f"trainer {trainer.id!r} is not in the Pollux workload")
            app = sim_app(spec.app, self.data_dir, spec.replicas_per_node)
            seed = np.random.SeedSequence([self.options.seed, zlib.crc32(trainer.id.encode())])
            agent = PolluxAgent(
                trainer.id,
                app.limits,
                replicas_per_node=app.r,
                lr_rule_name=LR_RULE,
                warmup_steps=0,  # the truth has no slow first steps
                smoothing=self.options.gns_smoothing,
                clock=lambda: self._now_s if self._now_s is not None else 0.0,
            )
            tr = SimTrainer(
                spec=spec,
                app=app,
                rng=np.random.default_rng(seed),
                agent=agent,
                cadence=RetuneCadence(app.limits, enabled=self.options.batch_adapt),
            )
            self._trainers[trainer.id] = tr
        return tr

    def _rates(self, tr: SimTrainer) -> tuple[float, float]:
        """(samples/s, base-batch steps/s) of the current configuration, now."""
        assert tr.config is not None
        step_s, _ = tr.app.step_time(tr.config, tr.placement)
        gain = tr.app.stats(tr.config.batch_size, tr.app.segment(tr.progress)).gain
        return tr.config.batch_size / step_s, gain / step_s

    def _charge(self, tr: SimTrainer, seconds: float) -> float:
        """R seconds at the current configuration: samples lost; progress lost too."""
        if tr.config is None or tr.done or seconds <= 0:
            return 0.0
        samples_sps, progress_ps = self._rates(tr)
        tr.progress = max(0.0, tr.progress - seconds * progress_ps)
        return seconds * samples_sps

    def _time_to_target(self, tr: SimTrainer) -> float:
        assert tr.config is not None
        step_s, _ = tr.app.step_time(tr.config, tr.placement)
        return step_s * tr.app.steps_to_target(tr.config.batch_size, tr.progress)

    def _integrate(self, t: TrainerState, tr: SimTrainer, t0_s: float, dt_s: float) -> float:
        """Run ``tr`` at its configuration from ``t0_s`` for ``dt_s`` (or to its target)."""
        assert tr.config is not None
        app, cfg = tr.app, tr.config
        m, m0 = cfg.batch_size, app.limits.base_batch_size
        step_s, fallback = app.step_time(cfg, tr.placement)
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
                tr.agent.gns.update(GradientSample(st.grad_sqr, st.grad_var, m), used * samples_sps)
                tr.statistical_samples += rate * used * m0
                tr.efficiency_s += efficiency * used
                self._series.add(now, used, cfg.nodes, samples_sps, rate * m0, efficiency, m)
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
        tr.run_s += ran_s
        tr.batch_s += m * ran_s
        if fallback:
            tr.fallback_s += ran_s
        if steps > 0:
            # The interval's mean step time as the trainer measured it, told to its agent.
            seen = step_s * math.exp(self.options.noise * float(tr.rng.standard_normal()))
            tr.agent.observe_steps(steps, seen)
        return samples

    # -- the trainer's own model ---------------------------------------------------------
    def _refit(self, tr: SimTrainer, now_s: float) -> bool:
        """Refit the agent's step-time model if a configuration was run that the last fit
        missed (at most once every ``refit_interval_s`` after the first fit)."""
        agent = tr.agent
        if not agent.new_configs:
            return False
        if (
            agent.model is not None
            and now_s - tr.last_fit_s < self.options.refit_interval_s - TIME_EPS_S
        ):
            return False
        agent.fit()
        tr.last_fit_s = now_s
        tr.refits += 1
        return True

    def _goodput_model(self, tr: SimTrainer, now_s: float) -> GoodputModel | None:
        """The agent's goodput model from its last fit (None before the first), also for
        a trainer that comes back from zero nodes: it keeps what it learned."""
        self._refit(tr, now_s)
        return tr.agent.goodput_model(refit=False)

    def _refit_and_report(self, t: TrainerState, tr: SimTrainer, now_s: float) -> list[CurveReport]:
        """After a refit, or when a check is due: report curves and (adapting) re-pick the
        batch size, as the live agent does on its reporting timer."""
        refitted = self._refit(tr, now_s)
        if not refitted and now_s < tr.next_check_s - TIME_EPS_S:
            return []
        tr.next_check_s = now_s + self.options.report_interval_s
        model = tr.agent.model
        if model is None or tr.config is None:
            return []
        gm = tr.agent.metrics(refit=False).goodput_model()
        spread: tuple[Curve, Curve] | None = None
        best_configs: list[GoodputConfig | None]
        if self.options.slots_per_node > 1:
            goodput, throughput, *rest = slot_curves(t, tr, gm, self.options)
            spread, best_configs = (rest[0], rest[1]), []
        else:
            goodput, throughput, best_configs = node_curves(t, tr, gm, self.options)
        tr.reports += 1
        true_s, _ = tr.app.step_time(tr.config, tr.placement)
        predicted = float(
            model.step_time_s(
                tr.config.nodes, tr.config.replicas, tr.config.local_bsz, tr.config.accum_steps
            )
        )
        tr.model_error_sum += abs(predicted / true_s - 1)
        tr.model_error_n += 1
        passes = tr.app.passes(tr.samples)  # the live runtime's epochs: over its samples
        if self.options.batch_adapt and tr.cadence.due(passes, now_s + TIME_EPS_S):
            # The live runtime's cadence, and what a decision costs there.
            tr.retune_decisions += 1
            tr.retune_cost_samples += self._charge(tr, self.options.retune_cost_s)
            cfg = tr.config
            if self.options.slots_per_node > 1:
                best = best_at(gm, cfg.nodes, cfg.replicas)
            else:
                best = best_configs[cfg.nodes - 1] if cfg.nodes <= len(best_configs) else None
                if best is None:
                    best = gm.best_config(cfg.nodes)
            move = retune_choice(
                gm,
                cfg.nodes,
                cfg.replicas,
                cfg.local_bsz,
                cfg.accum_steps,
                best=best,
                switch_gain=self.options.switch_gain,
            )
            if move is not None:
                tr.run(TrainerConfig(move.nodes, move.replicas, move.local_bsz, move.accum_steps))
            cost_s = self.options.retune_cost_s
            tr.cadence.record(move is not None, passes, now_s - cost_s, now_s)
        reports = [
            CurveReport(t.id, "goodput", goodput),
            CurveReport(t.id, "throughput", throughput),
        ]
        if spread is not None:
            reports += [
                CurveReport(t.id, spread_metric("goodput"), spread[0]),
                CurveReport(t.id, spread_metric("throughput"), spread[1]),
            ]
        return reports

    def _set_config(self, t: TrainerState, tr: SimTrainer, holding: tuple[str, ...]) -> None:
        """The configuration to run on ``holding`` (None when it holds none)."""
        if self.options.slots_per_node > 1:
            self._set_slot_config(tr, holding)
            return
        nodes = len(holding)
        if nodes <= 0 or tr.done:
            tr.run(None)
            tr.next_check_s = math.inf
            return
        now = self._now_s if self._now_s is not None else 0.0
        # A live agent refits once it has timed some steps of the new configuration.
        tr.next_check_s = now + self.options.refit_interval_s
        tr.cadence.restart(tr.app.passes(tr.samples), now)
        if not self.options.batch_adapt:
            tr.run(tr.app.config(nodes, tr.spec.local_bsz))
            return
        gm = self._goodput_model(tr, now)
        if gm is None and self.options.start_batch == "user":
            tr.run(tr.app.config(nodes, tr.spec.local_bsz))
        elif gm is None:
            tr.run(tr.app.default_config(nodes))
        else:
            best = gm.best_config(nodes)
            tr.run(TrainerConfig(best.nodes, best.replicas, best.local_bsz, best.accum_steps))

    def _set_slot_config(self, tr: SimTrainer, holding: tuple[str, ...]) -> None:
        """Slots: the configuration on this placement (replicas per node)."""
        if not holding or tr.done:
            tr.placement = None
            tr.run(None)
            tr.next_check_s = math.inf
            return
        now = self._now_s if self._now_s is not None else 0.0
        tr.next_check_s = now + self.options.refit_interval_s
        tr.cadence.restart(tr.app.passes(tr.samples), now)
        tr.placement = tuple(sorted(Counter(holding).values()))
        m, k = len(tr.placement), len(holding)
        gm = self._goodput_model(tr, now) if self.options.batch_adapt else None
        if gm is None and (not self.options.batch_adapt or self.options.start_batch == "user"):
            tr.run(tr.app.config(m, tr.spec.local_bsz, replicas=k))
        elif gm is None:
            tr.run(tr.app.default_config(m, replicas=k))
        else:
            best = best_at(gm, m, k)
            tr.run(TrainerConfig(best.nodes, best.replicas, best.local_bsz, best.accum_steps))

    # -- results -------------------------------------------------------------------------
    def report(self) -> PolluxReport:
        """The efficiency time series, per-trainer statistics and a summary."""
        end = self._now_s if self._now_s is not None else 0.0
        series = self._series.rows(end)
        trainers = {
            jid: {
                "app": tr.app.name,
                "target_progress": tr.app.target_progress,
                "progress": tr.progress,
                "finished_s": tr.finished_s,
                "run_s": tr.run_s,
                "steps": tr.agent.steps,
                "samples_processed": tr.samples,
                "statistical_samples": tr.statistical_samples,
                "efficiency": ratio(tr.efficiency_s, tr.run_s),
                "mean_batch_size": ratio(tr.batch_s, tr.run_s),
                "configs_run": len(tr.configs),
                "refits": tr.refits,
                "reports": tr.reports,
                "retune_decisions": tr.retune_decisions,
                "retune_cost_samples": tr.retune_cost_samples,
                "fallback_share": ratio(tr.fallback_s, tr.run_s),
                "model_error": ratio(tr.model_error_sum, tr.model_error_n),
                "pgns": tr.agent.pgns,
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
            "statistical_efficiency": ratio(
                sum(tr.statistical_samples for tr in self._trainers.values()), samples
            ),
            "mean_statistical_efficiency": ratio(
                sum(tr.efficiency_s for tr in self._trainers.values()), run_s
            ),
            "refits": sum(tr.refits for tr in self._trainers.values()),
            "reports": sum(tr.reports for tr in self._trainers.values()),
            "retune_decisions": sum(tr.retune_decisions for tr in self._trainers.values()),
            "fallback_time_share": ratio(
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
    options: PolluxSimOptions = PolluxSimOptions()  # noqa: RUF009 - frozen, so one is shared safely

    def __call__(self) -> PolluxSimDriver:
        return PolluxSimDriver(dict(self.jobs), self.data_dir, self.options)
