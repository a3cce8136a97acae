"""Curves nobody gives: the replay's trainers learn their scaling as they run.

``bftrainer replay --curves learned``: a trainer's true curve (its job's profile) drives
its progress, as in the plain replay, but the policy never sees it. The loop's trainers
carry a prior curve from their arrival on (:class:`PriorArrivals`), and the driver
reports, as a live trainer does, the curve built from what each trainer has measured so
far (``bftrainer.trainers.learned_curve``, the rule ``bftrainer status`` labels live
curves by):

* **Measurement.** After ``observe_s`` seconds at one node count (counted from the end
  of the stall that a rescale costs), a trainer has one measurement of its rate there:
  the truth times a seeded log-normal factor ``exp(noise x z)``; every further
  ``observe_s`` adds one more (the point is their geometric mean). A node count measured
  for the first time is a curve report, and the loop re-decides at most every
  ``redecide_every_s`` (``bftrainer.policies.config.Config``).
* **Optimistic prior** (Pollux): perfect scaling past the largest count run, capped at
  ``growth`` x it. A trainer with nothing measured scales perfectly at the best rate per
  node any trainer has measured so far (the best of their points, each a mean of its
  measurements), up to its n_min.
* **Peers** (``peers``): the optimistic rule, with what every trainer of the same model
  (``JobSpec.model``: an HPO sweep's trials) has measured as the prior at the counts
  this one has not run; with no peer yet, as optimistic.
* **Profiling start** (MalleTrain's job profiling advisor): on its first allocation of n
  nodes, a trainer runs a short probe on them: ``observe_s`` at each power of
  ``probe_base`` below n (1, 4, 16 below 64), then n. Each step up stalls R_up; while it
  probes, its other nodes idle. What that loses against running at n from the start is
  ``probe_cost_samples``; it is in U (those samples were never processed). Before its
  probe a trainer's prior is perfect scaling up to n_max; after it, the optimistic rule.

With every trainer, the driver counts samples (net of costs) and node-seconds by the
trainer's age (before and after ``YOUNG_S``), for U over young and older trainers.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from bftrainer.common.limits import CURVE_VALUE_MAX
from bftrainer.loop import Arrival, CurveReport, Input, Polled, Progress, TimedSource, TrainerState
from bftrainer.loop.jobs import JobSpec
from bftrainer.replay.simulator import SimulatedDriver, capped_cost
from bftrainer.trainers.learned_curve import (
    EXPLORATION_GROWTH,
    LEVEL_STEP,
    NO_CAP,
    LearnedCurve,
    Measurements,
    learned_curve,
)

CURVES = ("known", "learned")
PRIORS = ("optimistic", "profile", "peers")
YOUNG_S = 600.0  # a trainer's first 10 minutes


class LearningError(ValueError):
    """Options of the learning trainers that cannot work; names the value."""


@dataclass(frozen=True)
class LearningOptions:
    """How the replay's trainers learn their curves; defaults in one place."""

    prior: str = "peers"  # what peers measured, else optimistic (docs/benchmarks.md: best U)
    noise: float = 0.05
    observe_s: float = 30.0
    growth: float = float(EXPLORATION_GROWTH)
    probe_base: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.prior not in PRIORS:
            raise LearningError(f"prior {self.prior!r}: expected one of {', '.join(PRIORS)}")
        for name, lo, hi in (
            ("noise", 0.0, 2.0),
            ("observe_s", 1e-3, 1e6),
            ("growth", 1.0, NO_CAP),  # finite, as every setting: NO_CAP is no cap
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (lo <= v <= hi):
                no_cap = f" ({NO_CAP:g}: no cap)" if name == "growth" else ""
                raise LearningError(f"{name} {v!r}: expected a number in [{lo:g}, {hi:g}]{no_cap}")
        for name, lo in (("probe_base", 2), ("seed", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise LearningError(f"{name} {v!r}: expected an integer >= {lo}")


@dataclass
class AgeTally:
    """Samples net of costs, and node-seconds held, by trainer age."""

    samples: list[float] = field(default_factory=lambda: [0.0, 0.0])
    node_s: list[float] = field(default_factory=lambda: [0.0, 0.0])

    def add(self, age0_s: float, age1_s: float, samples: float, nodes: int) -> None:
        """Split an interval of a trainer's life pro rata at ``YOUNG_S``."""
        span = age1_s - age0_s
        if span <= 0:
            return
        young = min(max(YOUNG_S - age0_s, 0.0), span) / span
        for i, share in ((0, young), (1, 1.0 - young)):
            if share > 0:
                self.samples[i] += samples * share
                self.node_s[i] += nodes * span * share

    def cost(self, age_s: float, samples: float) -> None:
        self.samples[0 if age_s < YOUNG_S else 1] -= samples

    def utilization(self, per_node_s: float) -> tuple[float, float]:
        """(young, older) samples per node-second held, over ``per_node_s`` (the
        baseline's samples per node-second: U's A_s over R)."""
        return tuple(  # type: ignore[return-value]
            s / (n * per_node_s) if n > 0 and per_node_s > 0 else math.nan
            for s, n in zip(self.samples, self.node_s, strict=True)
        )


class AgedDriver(SimulatedDriver):
    """The plain replay's driver, counting samples and node-seconds by trainer age."""

    def __init__(self, slots_per_node: int = 1) -> None:
        super().__init__(slots_per_node)
        self.ages = AgeTally()
        self._then: float | None = None

    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        before = [t.processed_samples for t in trainers]
        self._then = self._now_s
        progress = super().advance(trainers, now_s)
        if self._then is not None and now_s > self._then:
            for t, b in zip(trainers, before, strict=True):
                if t.started_s is not None:
                    age0, age1 = self._then - t.started_s, now_s - t.started_s
                    self.ages.add(age0, age1, t.processed_samples - b, len(t.nodes))
        return progress

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        return self._cost(trainer, super().rescale(trainer, nodes))

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        return self._cost(trainer, super().preempt(trainer, old_count))

    def _cost(self, trainer: TrainerState, samples: float) -> float:
        if samples and trainer.started_s is not None and self._now_s is not None:
            self.ages.cost(self._now_s - trainer.started_s, samples)
        return samples


@dataclass
class _Learner:
    """What one trainer has measured and what it runs now."""

    rng: np.random.Generator
    seen: Measurements = field(default_factory=Measurements)
    count: int = 0  # the nodes it runs on now (a probe size while it probes)
    since_s: float = 0.0  # when the current stint's measuring starts (after its stall)
    windows: int = 0  # measurements taken in this stint
    started: bool = False
    probing: bool = False  # from its first allocation to its next rescale (profile prior)
    stages: list[int] = field(default_factory=list)  # probe sizes still to run, then n
    stage_end_s: float = math.inf
    stall_until_s: float = -math.inf  # a probe's step up: nothing processed


# The least rate a learning trainer can measure (samples/s): a rate of 0 has no
# logarithm (the geometric mean of measurements), and a subnormal one's inverse is
# infinite (the scaling fit's seconds per sample).
MIN_LEARNED_RATE_SPS = 1e-6


def check_learnable(job: JobSpec) -> None:
    """Refuse, in one line, a job whose trainer could not measure its rate at some node
    count from 1 to n_max: the rate there is 0 or below ``MIN_LEARNED_RATE_SPS``. The
    curve is linear between breakpoints, so its least rate over whole counts is at 1,
    n_max or a whole count next to a breakpoint."""
    counts = {1, job.n_max}
    for n, _ in job.curve:
        counts.update((math.floor(n), math.ceil(n)))
    for n in sorted(c for c in counts if 1 <= c <= job.n_max):
        rate = job.rate_sps(n)
        if not rate >= MIN_LEARNED_RATE_SPS:
            raise LearningError(
                f"job {job.id!r}: its curve gives {rate:g} samples/s at {n} node(s); a "
                f"trainer that learns its curve needs at least {MIN_LEARNED_RATE_SPS:g} at "
                f"every count from 1 to n_max {job.n_max}"
            )


class LearningDriver(AgedDriver):
    """The plain replay's driver, with trainers that measure and report their curves."""

    def __init__(
        self, truth: Mapping[str, JobSpec], options: LearningOptions, slots_per_node: int = 1
    ) -> None:
        if slots_per_node != 1:
            raise LearningError("learned curves run with whole nodes (slots_per_node 1)")
        super().__init__(slots_per_node)
        for job in truth.values():
            check_learnable(job)
        self.truth = dict(truth)
        self.options = options
        self.probe_cost_samples = 0.0
        self.measurements = 0
        self.best_per_node_sps = 0.0
        self._learners: dict[str, _Learner] = {}
        self._priors: dict[str, float] = {}  # trainers on their prior: the level stated
        self._peers: dict[str, Measurements] = {}  # every measurement, by model
        self._stated_level = 0.0

    # -- the truth ----------------------------------------------------------------------
    def true_rate_sps(self, trainer: TrainerState, count: int) -> float:
        return self.truth[trainer.id].rate_sps(count)

    def _rate(self, trainer: TrainerState, holding: tuple[str, ...]) -> float:
        lr = self._learners.get(trainer.id)
        if lr is None or not lr.probing or not holding:
            return super()._rate(trainer, holding)
        if self._then is not None and self._then < lr.stall_until_s:
            return 0.0
        return self.true_rate_sps(trainer, lr.count)

    # -- the loop's driver --------------------------------------------------------------
    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        then = self._now_s
        if then is not None and now_s > then:
            for t in trainers:  # what probing loses, at the interval's rates (before it)
                lr = self._learners.get(t.id)
                if lr is not None and lr.probing:
                    self._then = then
                    full = self.true_rate_sps(t, len(t.nodes))
                    self.probe_cost_samples += (full - self._rate(t, t.nodes)) * (now_s - then)
        progress = super().advance(trainers, now_s)
        reports: list[CurveReport] = []
        for t in trainers:
            lr = self._learners.get(t.id)
            if lr is None:
                continue
            new = self._observe(t, lr, now_s)
            self._next_stage(t, lr, now_s)
            if new:
                reports.append(CurveReport(t.id, "throughput", self.learned(t).points))
        for c in progress.reports:
            self._priors.pop(c.trainer_id, None)
        self._then = now_s  # what runs from now on (for wake-ups and costs)
        return Progress(progress.processed_samples, (*reports, *progress.reports))

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        cost = super().rescale(trainer, nodes)
        lr = self._learner(trainer)
        now = self._now_s or 0.0
        if nodes and not lr.started and self.options.prior == "profile":
            lr.started = lr.probing = True
            lr.stages = self._probe(len(nodes), trainer.job.n_min)
            lr.count, lr.since_s, lr.windows = lr.stages.pop(0), now, 0
            lr.stage_end_s = now + self.options.observe_s if lr.stages else math.inf
            return cost
        lr.started = lr.started or bool(nodes)
        if len(nodes) == lr.count and not lr.probing:
            return cost
        grew = len(nodes) > lr.count
        stall = trainer.job.rescale_up_s if grew else trainer.job.rescale_down_s
        self._stint(lr, len(nodes), now + (stall if lr.count else 0.0))
        return cost

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        lr = self._learner(trainer)
        ran = lr.count if lr.probing and lr.count else old_count
        cost, share = capped_cost(
            trainer, trainer.job.rescale_down_s * self.true_rate_sps(trainer, ran)
        )
        trainer.preemption_cost_samples += cost
        self.waste.stalled_node_s += trainer.job.rescale_down_s * old_count * share
        self._cost(trainer, cost)
        self._stint(lr, len(trainer.nodes), (self._now_s or 0.0) + trainer.job.rescale_down_s)
        return cost

    def next_wakeup_s(self, trainers: Sequence[TrainerState], now_s: float) -> float:
        best = super().next_wakeup_s(trainers, now_s)
        for t in trainers:
            lr = self._learners.get(t.id)
            if lr is None or not lr.count:
                continue
            if lr.probing and lr.stall_until_s > now_s:
                best = min(best, lr.stall_until_s)
            if lr.stages:
                best = min(best, lr.stage_end_s)
            if lr.seen.count(lr.count) == 0:
                best = min(best, max(lr.since_s + self.options.observe_s, lr.since_s))
        return best

    # -- what the policy sees -----------------------------------------------------------
    def prior_job(self, job: JobSpec) -> JobSpec:
        """The job as the loop sees it on arrival: its prior curve, never its profile."""
        level = self._level()
        self._priors[job.id] = level
        return replace(job, curve=self._prior_curve(job, level))

    def restated_priors(self) -> list[CurveReport]:
        """Waiting trainers' priors, restated where the best measured rate has risen."""
        level = self._level()
        if level <= self._stated_level * LEVEL_STEP:
            return []
        self._stated_level = level
        out = []
        for tid, stated in self._priors.items():
            if level > stated * LEVEL_STEP:
                self._priors[tid] = level
                curve = self._prior_curve(self.truth[tid], level)
                out.append(CurveReport(tid, "throughput", curve))
        return out

    def learned(self, trainer: TrainerState) -> LearnedCurve:
        """The curve the trainer reports now: what it measured, the prior elsewhere."""
        job = trainer.job
        return learned_curve(
            self._learner(trainer).seen.means(),
            job.n_min,
            job.n_max,
            unmeasured_sps=self._level(),
            growth=self.options.growth,
            prior_points=self._peer_points(job),
        )

    def _peer_points(self, job: JobSpec) -> dict[int, float] | None:
        if self.options.prior != "peers" or job.model not in self._peers:
            return None
        return self._peers[job.model].means()

    def _prior_curve(self, job: JobSpec, level: float) -> tuple[tuple[float, float], ...]:
        if self.options.prior == "profile":  # the probe will measure: no cap before it
            return ((float(job.n_max), min(job.n_max * level, CURVE_VALUE_MAX)),)
        return learned_curve(
            {},
            job.n_min,
            job.n_max,
            unmeasured_sps=level,
            growth=self.options.growth,
            prior_points=self._peer_points(job),
        ).points

    def _level(self) -> float:
        return self.best_per_node_sps or 1.0

    # -- measuring ----------------------------------------------------------------------
    def _learner(self, trainer: TrainerState) -> _Learner:
        lr = self._learners.get(trainer.id)
        if lr is None:
            seed = zlib.crc32(f"{self.options.seed}:{trainer.id}".encode())
            lr = self._learners[trainer.id] = _Learner(np.random.default_rng(seed))
        return lr

    @staticmethod
    def _stint(lr: _Learner, count: int, since_s: float) -> None:
        lr.count, lr.since_s, lr.windows = count, since_s, 0
        lr.probing, lr.stages, lr.stage_end_s = False, [], math.inf

    def _observe(self, t: TrainerState, lr: _Learner, now_s: float) -> bool:
        """Measurements of the stint's windows that ended by ``now_s``; True if a node
        count got its first."""
        if not lr.count or now_s < lr.since_s:
            return False
        # At trace times (~1.6e9 s) a window's end lies a few ulps off since + observe:
        # the slack counts it as ended where next_wakeup_s woke the loop for it (without
        # it, observe_s 0.001 woke the loop at an end it then did not count, for ever).
        slack = 4 * math.ulp(now_s) / self.options.observe_s + 1e-9
        windows = int((now_s - lr.since_s) / self.options.observe_s + slack)
        new = False
        true = self.true_rate_sps(t, lr.count)
        for _ in range(windows - lr.windows):
            rate = true * math.exp(self.options.noise * float(lr.rng.standard_normal()))
            new |= lr.seen.add(lr.count, rate)
            self._peers.setdefault(t.job.model, Measurements()).add(lr.count, rate)
            self.measurements += 1
        if windows > lr.windows:  # the level is an estimate, not the luckiest single draw
            self.best_per_node_sps = max(self.best_per_node_sps, lr.seen.mean(lr.count) / lr.count)
        lr.windows = max(lr.windows, windows)
        if new:
            self._priors.pop(t.id, None)
        return new

    def _next_stage(self, t: TrainerState, lr: _Learner, now_s: float) -> None:
        """A probe stage that ended: step up to the next size, stalling R_up."""
        if not lr.stages or now_s < lr.stage_end_s:
            return
        lr.count = lr.stages.pop(0)
        lr.stall_until_s = lr.since_s = now_s + t.job.rescale_up_s
        lr.windows = 0
        lr.stage_end_s = lr.since_s + self.options.observe_s if lr.stages else math.inf

    def _probe(self, n: int, n_min: int) -> list[int]:
        """The probe's sizes on a first allocation of ``n``: powers of ``probe_base`` from
        n_min up, below n, then n."""
        sizes, k = [], 1
        while k < n:
            if k >= n_min:
                sizes.append(k)
            k *= self.options.probe_base
        return [*sizes, n]


class PriorArrivals:
    """The job list as a loop source, each job with its prior curve (the driver's):
    and, with every poll, waiting trainers' priors restated."""

    def __init__(self, jobs: Sequence[JobSpec], driver: LearningDriver) -> None:
        self._source = TimedSource((j.submit_s, Arrival(j)) for j in jobs)
        self._driver = driver

    @property
    def exhausted(self) -> bool:
        return self._source.exhausted

    def poll(self, now_s: float) -> Polled:
        polled = self._source.poll(now_s)
        restated: list[Input] = list(self._driver.restated_priors())
        arrived: list[Input] = [
            Arrival(self._driver.prior_job(a.job)) if isinstance(a, Arrival) else a
            for a in polled.inputs
        ]
        return Polled((*restated, *arrived), polled.next_s)
