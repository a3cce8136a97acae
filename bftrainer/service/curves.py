"""The throughput curve the daemon plans on for each trainer: the replay's rule.

``bftrainer replay --curves learned`` and the daemon learn alike, by one rule
(``bftrainer.trainers.learned_curve``, docs/allocator.md "Curves nobody gives"): a
trainer's measured points, Pollux's optimistic prior elsewhere (capped at 2x the largest
count run), and for a trainer with nothing measured yet perfect scaling up to its n_min
at the best rate per node any trainer has measured (1 sample/s before any has). The
prior is ``peers`` by default, as the replay's (``--prior peers``): what the trainers of
the same model (``JobSpec.model``, the script's name: a search's trials) measured stands
at the counts a trainer has not run, and the optimistic rule where no peer has measured
either. Only the source of the points differs: the replay draws them from a job's
profile, the daemon reads them from the trainers' metrics records (the rate at each
count it ran).

The live driver feeds :meth:`LiveCurves.measured` from each record; the daemon's
submission queue gives each arriving trainer :meth:`LiveCurves.prior_job` and passes on
:meth:`LiveCurves.restated`, as the replay's ``PriorArrivals`` does: a trainer waiting
on its prior is told when the best rate rose, so it is never valued below the trainers
that run (which would starve it under the throughput objective: never run, never
measured).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from bftrainer.loop import Curve, CurveReport
from bftrainer.loop.jobs import JobSpec
from bftrainer.state import Store
from bftrainer.trainers.learned_curve import (
    EXPLORATION_GROWTH,
    LEVEL_STEP,
    Measurements,
    learned_curve,
    measured_rate_sps,
)
from bftrainer.trainers.metrics import MetricsRecord

log = logging.getLogger(__name__)

# The store's setting that keeps the best rate per node across daemon restarts (the
# trainers that set it may have finished: their records are not read again).
LEVEL_SETTING = "best_per_node_sps"
PRIORS = ("peers", "optimistic")  # the replay's --prior, less ``profile`` (a probe)


@dataclass
class LiveCurves:
    """What each trainer measured, the best rate per node, and who waits on a prior."""

    store: Store | None = None
    growth: float = float(EXPLORATION_GROWTH)
    prior: str = "peers"
    best_per_node_sps: float = 0.0
    _rates: dict[str, dict[int, float]] = field(default_factory=dict)
    _peers: dict[str, Measurements] = field(default_factory=dict)  # every rate, by model
    _priors: dict[str, tuple[JobSpec, float]] = field(default_factory=dict)
    _stated_level: float = 0.0

    def __post_init__(self) -> None:
        if self.prior not in PRIORS:
            raise ValueError(f"prior {self.prior!r}: expected one of {', '.join(PRIORS)}")
        if self.store is not None:
            stored = self.store.get_setting(LEVEL_SETTING, 0.0)
            if isinstance(stored, int | float) and stored > 0:
                self.best_per_node_sps = max(self.best_per_node_sps, float(stored))
        self._stated_level = self.level

    @property
    def level(self) -> float:
        """The rate per node a trainer with nothing measured is given."""
        return self.best_per_node_sps or 1.0

    def prior_job(self, job: JobSpec) -> JobSpec:
        """``job`` as the loop sees it on arrival: the prior of nothing measured (or its
        curve so far, when it measured before a daemon restart)."""
        rates = self._rates.get(job.id)
        if rates:
            return replace(job, curve=self._curve(job, rates))
        level = self.level
        self._priors[job.id] = (job, level)
        return replace(job, curve=self._curve(job, {}))

    def measured(self, job: JobSpec, record: MetricsRecord) -> Curve | None:
        """The trainer's curve after ``record`` (None: the record timed no step yet)."""
        rate = measured_rate_sps(record)
        if rate is None or record.nodes < 1:
            return None
        rates = self._rates.setdefault(job.id, {})
        rates[record.nodes] = rate
        self._peers.setdefault(job.model, Measurements()).add(record.nodes, rate)
        self._priors.pop(job.id, None)
        best = rate / record.nodes
        if best > self.best_per_node_sps:
            rose = best > self.best_per_node_sps * LEVEL_STEP
            self.best_per_node_sps = best
            if rose and self.store is not None:
                self.store.set_setting(LEVEL_SETTING, best)
        return self._curve(job, rates)

    def restated(self) -> list[CurveReport]:
        """Priors of trainers with nothing measured, restated where the best rate per
        node rose by ``LEVEL_STEP`` since they were told."""
        level = self.level
        if level <= self._stated_level * LEVEL_STEP:
            return []
        self._stated_level = level
        out = []
        for tid, (job, stated) in self._priors.items():
            if level > stated * LEVEL_STEP:
                self._priors[tid] = (job, level)
                out.append(CurveReport(tid, "throughput", self._curve(job, {})))
        if out:
            log.info("%d waiting trainer(s) now valued at %.3g samples/s per node", len(out), level)
        return out

    def forget(self, trainer_id: str) -> None:
        """A finished trainer: its rates go (the best rate per node stays)."""
        self._rates.pop(trainer_id, None)
        self._priors.pop(trainer_id, None)

    def _curve(self, job: JobSpec, rates: dict[int, float]) -> Curve:
        peers = self._peers.get(job.model) if self.prior == "peers" else None
        return learned_curve(
            rates,
            job.n_min,
            job.n_max,
            unmeasured_sps=self.level,
            growth=self.growth,
            prior_points=peers.means() if peers is not None else None,
        ).points
