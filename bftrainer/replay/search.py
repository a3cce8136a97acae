"""A search replayed: an Optuna study's trials as the replay's trainers, pruned early.

``SearchSource`` is a loop source (a :class:`~bftrainer.loop.Reader`: it sees the loop's
trainers before each step) that asks the study for a trial whenever the pool can run
one more, as ``bftrainer hpo`` does live (bftrainer/hpo/), and submits it as a job of
the template's throughput curve. Each trial's validation loss follows a seeded curve of
a parametric family (``CurveFamily``); the source reports it to the study at every
``report_every`` samples the trial has done and cancels the trial when the study's
pruner says so. The sampler and pruner are Optuna's own, as live.

The family: ``loss(s) = c + a (1 + s / s0)^-alpha`` (the "pow3" learning curve of
Domhan, Springenberg and Hutter, IJCAI 2015, whose fits of real networks' curves are
power laws, as Hestness et al., 2017, found across domains), with ``c`` and ``alpha``
smooth functions of the trial's two parameters (a learning rate on a log scale and a
width), the best point and a per-trial offset drawn from the seed. The target is the
1st percentile of the family's final losses over 10,000 uniform draws: the same for
every policy and pruner compared (docs/replay.md, "Searches").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from bftrainer.common.promise import promise_weight, rungs_passed
from bftrainer.loop import Arrival, Cancel, Input, LoopView, Polled, TrainerState
from bftrainer.loop.jobs import JobSpec

if TYPE_CHECKING:
    import optuna

SEARCHES = ("tpe", "random")
SEARCH_PRUNERS = ("asha", "hyperband", "none")
# The flag's limit on trials and the config's (a million trials is a typo, not a search).
SEARCH_TRIALS_MAX = 100_000
# Optuna's samplers take a seed of 32 bits.
SEARCH_SEED_MAX = 2**32 - 1
REPORTS_PER_TRIAL = 20  # a report every 1/20 of a trial's work
POLL_S = 60.0  # how often the source looks at its trials (the campaign's poll)


@dataclass(frozen=True)
class CurveFamily:
    """Seeded learning curves over ``work`` samples (a trial's full budget)."""

    seed: int
    work: float

    @property
    def best(self) -> tuple[float, float]:
        """The parameters (lr's position in [0, 1] on its log scale, width) of the
        lowest final loss, drawn from the seed."""
        rng = np.random.default_rng(self.seed)
        return float(rng.uniform(0.3, 0.8)), float(rng.uniform(0.2, 0.9))

    def shape(self, lr: float, width: float, offset: float) -> tuple[float, float, float]:
        u = (math.log10(lr) + 4.0) / 4.0
        bu, bw = self.best
        d2 = (u - bu) ** 2 + 0.5 * (width - bw) ** 2
        c = 0.05 + 2.0 * d2 + offset
        alpha = 0.4 + 1.2 * math.exp(-((u - bu) ** 2) / 0.05)  # a good lr learns fast
        return c, 2.0, alpha

    def loss(self, lr: float, width: float, offset: float, samples: float) -> float:
        c, a, alpha = self.shape(lr, width, offset)
        return c + a * (1.0 + samples / (self.work / 100.0)) ** -alpha

    def target(self) -> float:
        """The 1st percentile of final losses over 10,000 uniform draws."""
        rng = np.random.default_rng(self.seed + 1)
        lrs = 10 ** rng.uniform(-4.0, 0.0, 10_000)
        widths = rng.uniform(0.0, 1.0, 10_000)
        offsets = rng.normal(0.0, 0.01, 10_000)
        finals = [self.loss(*p, self.work) for p in zip(lrs, widths, offsets, strict=True)]
        return float(np.percentile(finals, 1.0))


@dataclass
class _Trial:
    trial: optuna.Trial
    job: JobSpec
    offset: float
    state: TrainerState | None = None
    reported: int = 0  # reports made (the k-th at k x report_every samples)
    ended: bool = False  # told to the study
    rungs: int = 0  # the pruner's rungs it has passed: its promise


@dataclass
class SearchSource:
    """Trials of ``search`` (tpe, random) pruned by ``pruner`` (asha, hyperband, none),
    ``n_trials`` of them, each a job like ``template``."""

    template: JobSpec
    search: str
    pruner: str
    n_trials: int
    seed: int = 0
    max_parallel: int = 10
    promise: float = 1.0  # a trial's weight is promise ** (rungs passed): ``weight``
    family: CurveFamily = field(init=False)
    target: float = field(init=False)
    time_to_target_s: float | None = None
    pruned: int = 0
    completed: int = 0
    _trials: dict[str, _Trial] = field(default_factory=dict)
    _view: LoopView | None = None
    _rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        if self.search not in SEARCHES or self.pruner not in SEARCH_PRUNERS:
            raise ValueError(
                f"search {self.search!r}, pruner {self.pruner!r}: expected one of "
                f"{SEARCHES} and one of {SEARCH_PRUNERS}"
            )
        self.family = CurveFamily(self.seed, self.template.work_samples)
        self.target = self.family.target()
        self._rng = np.random.default_rng(self.seed + 2)
        import optuna  # the hpo extra: only a search needs it

        sampler = (
            optuna.samplers.TPESampler(seed=self.seed)
            if self.search == "tpe"
            else optuna.samplers.RandomSampler(seed=self.seed)
        )
        every = int(self.template.work_samples / REPORTS_PER_TRIAL)
        pruners = {
            "asha": optuna.pruners.SuccessiveHalvingPruner(min_resource=every),
            "hyperband": optuna.pruners.HyperbandPruner(min_resource=every),
            "none": optuna.pruners.NopPruner(),
        }
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(sampler=sampler, pruner=pruners[self.pruner])
        self._start_s: float | None = None

    @property
    def report_every(self) -> float:
        return self.template.work_samples / REPORTS_PER_TRIAL

    @property
    def exhausted(self) -> bool:
        return len(self._trials) >= self.n_trials and not self._in_flight()

    def read(self, now_s: float, view: LoopView | None = None) -> None:
        self._view = view

    def poll(self, now_s: float) -> Polled:
        if self._start_s is None:
            self._start_s = now_s
        seen = {t.id: t for t in self._view.trainers} if self._view is not None else {}
        inputs: list[Input] = []
        for tid, tr in self._trials.items():
            if tr.state is None:
                tr.state = seen.get(tid)
            if tr.state is None or tr.ended:
                continue
            if self._follow(tr, now_s):
                inputs.append(Cancel(tid))
        inputs += self._ask(now_s)
        next_s = math.inf if self.exhausted else now_s + POLL_S
        return Polled(tuple(inputs), next_s)

    def weight(self, trainer_id: str) -> float:
        """A trial's promise as milp's weight on its objective term (``MilpPolicy``):
        ``promise`` to the power of the rungs it has passed, so a trial the pruner let
        on gets nodes before the new ones (1 for any other trainer)."""
        tr = self._trials.get(trainer_id)
        return 1.0 if tr is None else promise_weight(self.promise, tr.rungs)

    def summary(self, node_s: dict[str, float]) -> dict[str, object]:
        run = [t for t in self._trials.values() if t.state is not None]
        return {
            "search": self.search,
            "pruner": self.pruner,
            "search_promise": self.promise,
            "n_trials": self.n_trials,
            "target_loss": self.target,
            "time_to_target_s": self.time_to_target_s,
            "trials_run": len(run),
            "trials_pruned": self.pruned,
            "trials_completed": self.completed,
            "node_hours_per_trial": (
                sum(node_s.get(tid, 0.0) for tid in self._trials) / 3600.0 / len(run)
                if run
                else None
            ),
            "best_loss": min(
                (t.value for t in self.study.trials if t.value is not None), default=None
            ),
        }

    # -- inside ------------------------------------------------------------------------
    def _in_flight(self) -> list[_Trial]:
        return [t for t in self._trials.values() if not t.ended]

    def _tell(self, tr: _Trial, value: float | None, state: str) -> None:
        from optuna.trial import TrialState

        self.study.tell(tr.trial, value, state=TrialState[state])
        tr.ended = True

    def _value(self, tr: _Trial, samples: float) -> float:
        p = tr.trial.params
        return self.family.loss(p["lr"], p["width"], tr.offset, samples)

    def _reached(self, value: float, now_s: float) -> None:
        if self.time_to_target_s is None and value <= self.target and self._start_s is not None:
            self.time_to_target_s = now_s - self._start_s

    def _follow(self, tr: _Trial, now_s: float) -> bool:
        """Report what the trial has done since the last look; True: prune it."""
        state = tr.state
        assert state is not None
        work = tr.job.work_samples
        if state.finished_s is not None:
            value = self._value(tr, work)
            self._reached(value, now_s)
            self._tell(tr, value, "COMPLETE")
            self.completed += 1
            return False
        if state.cancelled_s is not None:  # cancelled outside the search: a failed trial
            self._tell(tr, None, "FAIL")
            return False
        done = state.progress_samples
        while (tr.reported + 1) * self.report_every <= min(done, work - 1):
            tr.reported += 1
            step = tr.reported * self.report_every
            value = self._value(tr, step)
            self._reached(value, now_s)
            tr.trial.report(value, int(step))
            if tr.trial.should_prune():
                self._tell(tr, None, "PRUNED")
                self.pruned += 1
                return True
            tr.rungs = self._rungs(tr)
        return False

    def _rungs(self, tr: _Trial) -> int:
        """The rungs Optuna's successive halving recorded for the trial (hyperband's
        brackets run it too): ``completed_rung_K`` system attributes (none: 0)."""
        return rungs_passed(self.study._storage.get_trial_system_attrs(tr.trial._trial_id))

    def _ask(self, now_s: float) -> list[Input]:
        out: list[Input] = []
        pool = len(self._view.pool) if self._view is not None else 0
        while len(self._trials) < self.n_trials:
            flying = self._in_flight()
            demand = sum(t.job.n_min for t in flying)
            if len(flying) >= self.max_parallel or pool - demand < self.template.n_min:
                break
            trial = self.study.ask(_space())
            tid = f"trial{trial.number:04d}"
            job = replace(self.template, id=tid, submit_s=now_s)
            self._trials[tid] = _Trial(trial, job, float(self._rng.normal(0.0, 0.01)))
            out.append(Arrival(job))
        return out


def node_seconds(changes: list[tuple[float, str, int]], end_s: float) -> dict[str, float]:
    """Each trainer's node-seconds from its node-count changes ``(time_s, id, nodes)``."""
    out: dict[str, float] = {}
    last: dict[str, tuple[float, int]] = {}
    for time_s, tid, nodes in sorted(changes):
        if tid in last:
            t0, n0 = last[tid]
            out[tid] = out.get(tid, 0.0) + n0 * (time_s - t0)
        last[tid] = (time_s, nodes)
    for tid, (t0, n0) in last.items():
        out[tid] = out.get(tid, 0.0) + n0 * max(0.0, end_s - t0)
    return out


def _space() -> dict[str, Any]:
    """The two parameters of the family: a learning rate (log scale) and a width."""
    from optuna.distributions import FloatDistribution

    return {
        "lr": FloatDistribution(1e-4, 1.0, log=True),
        "width": FloatDistribution(0.0, 1.0),
    }
