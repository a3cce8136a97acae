"""The training job as every part of bftrainer sees it: the trainer record.

One trainer has one set of names from ``bftrainer submit`` to the store
(``bftrainer.state.TrainerRow``) to the loop and the allocator (``JobSpec`` here;
``bftrainer.milp.TrainerSpec``) to the centre's protocol
(``bftrainer.centre.protocol.TrainerReport``): ``n_min``, ``n_max``, ``submit_s``,
``rescale_up_s``, ``rescale_down_s``, ``work_samples``. Work that only the trainer's own
stop ends is ``math.inf`` in every record; JSON and SQLite, which have no inf, write
null, converted in the record's own reader and writer. The converters between the
records sit beside them: the store's row to a job (:func:`job_of`) and a job to the
allocator's spec (:meth:`JobSpec.trainer_spec`) here, a job to and from the centre's
report in ``TrainerReport``; the outside names (``bftrainer status --json``'s
``min_nodes``, the launcher's ``--min-hosts``) are mapped at the edge that shows them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from bftrainer.milp import TrainerSpec
    from bftrainer.state import TrainerRow

# Whole-node counts whose rate a job tabulates (``JobSpec.rate_sps``); beyond, interpolated.
RATE_TABLE_MAX = 4096


@dataclass(frozen=True)
class JobSpec:
    """A training job: what it needs, when it arrives, how it scales.

    ``curve``: throughput breakpoints ``(nodes, samples/s)``; ``work_samples``: samples to
    process before it completes (``math.inf``: until its own stop). ``user`` and
    ``account`` own it, for fairness by user or account (empty: the one default owner).
    """

    id: str
    model: str
    submit_s: float
    n_min: int
    n_max: int
    rescale_up_s: float
    rescale_down_s: float
    work_samples: float
    curve: tuple[tuple[float, float], ...]
    user: str = ""
    account: str = ""

    @cached_property
    def breakpoints(self) -> tuple[np.ndarray, np.ndarray]:
        """The curve with (0, 0) prepended, built once: replays read it at every event."""
        xs = np.array([0.0] + [n for n, _ in self.curve])
        ys = np.array([0.0] + [v for _, v in self.curve])
        return xs, ys

    @cached_property
    def _rates(self) -> list[float]:
        """``rate_sps`` at 0..n_max (at most ``RATE_TABLE_MAX``) nodes, built once: a
        replay asks several times per trainer and event (np.interp per call was 6% of a
        year-scale replay at 100 trainers). The same interpolation, the same values."""
        xs, ys = self.breakpoints
        return np.interp(np.arange(min(self.n_max, RATE_TABLE_MAX) + 1), xs, ys).tolist()

    def rate_sps(self, nodes: int) -> float:
        """Throughput at ``nodes`` nodes, linear between breakpoints, 0 at 0."""
        if nodes <= 0:
            return 0.0
        rates = self._rates
        if nodes < len(rates) and type(nodes) is int:
            return rates[nodes]
        xs, ys = self.breakpoints
        return float(np.interp(nodes, xs, ys))

    def trainer_spec(
        self,
        curve: tuple[tuple[float, float], ...] | None = None,
        nodes: tuple[str, ...] = (),
        spread_curve: tuple[tuple[float, float], ...] | None = None,
        weight: float = 1.0,
    ) -> TrainerSpec:
        """The allocator's view of this job (``bftrainer.milp.TrainerSpec``, checked on
        construction): its limits, costs and owners, planned on ``curve`` (default: its
        own) while it holds ``nodes``."""
        from bftrainer.milp import TrainerSpec

        return TrainerSpec(
            id=self.id,
            n_min=self.n_min,
            n_max=self.n_max,
            rescale_up_s=self.rescale_up_s,
            rescale_down_s=self.rescale_down_s,
            curve=self.curve if curve is None else curve,
            nodes=nodes,
            user=self.user,
            account=self.account,
            spread_curve=spread_curve,
            weight=weight,
        )


def prior_curve(n_max: int) -> tuple[tuple[float, float], ...]:
    """Linear scaling at one (unit) sample per second per node: the centre allocator's
    prior before a trainer's agent reports (the daemon's loop plans on
    :class:`~bftrainer.service.curves.LiveCurves` instead, the replay's rule)."""
    return ((1.0, 1.0), (float(n_max), float(n_max))) if n_max > 1 else ((1.0, 1.0),)


def job_of(row: TrainerRow) -> JobSpec:
    """The loop's view of a trainer the store holds (its curve: :func:`prior_curve`;
    :meth:`LiveCurves.prior_job <bftrainer.service.curves.LiveCurves.prior_job>` gives the
    prior the daemon plans on). The model is the script's name."""
    return JobSpec(
        id=row.id,
        model=Path(row.script).name,
        submit_s=row.submit_s,
        n_min=row.n_min,
        n_max=row.n_max,
        rescale_up_s=row.rescale_up_s,
        rescale_down_s=row.rescale_down_s,
        work_samples=row.work_samples,
        curve=prior_curve(row.n_max),
    )


def jobs_in_slots(jobs: Sequence[JobSpec], slots_per_node: int) -> list[JobSpec]:
    """Jobs given per node (job files, the zoo) counted in slots of S per node.

    k slots packed are worth the curve at k / S nodes (linear within a node, as
    between breakpoints); n_max becomes n_max x S slots, and n_min more than n_min - 1
    whole nodes: (n_min - 1) x S + 1 slots, so a 1-node job can run on one slot. The
    same jobs at S = 1.
    """
    if slots_per_node == 1:
        return list(jobs)
    s = slots_per_node
    return [
        replace(
            j,
            n_min=(j.n_min - 1) * s + 1,
            n_max=j.n_max * s,
            curve=tuple((n * s, v) for n, v in j.curve),
        )
        for j in jobs
    ]


class JobSpecError(ValueError):
    """A workload the replay or daemon cannot run; the message names the job."""


def check_workload(jobs: Sequence[JobSpec], *, speedup: bool = False) -> None:
    """Refuse the whole workload up front if any job is bad, naming the first bad one.

    Every job must be a valid allocator trainer (``TrainerSpec``: n_min <= n_max, a
    curve that reaches n_max, costs within the allocator's limits), with positive
    finite work, a plausible submit time, and an id no other job has; with ``speedup``
    (a run under the speedup objective), a curve that objective can divide by its rate
    at 1 node (``check_speedup``). Checked once before the replay starts, rather than
    when the job first reaches the allocator.
    """
    from bftrainer.idle_monitor.trace import check_epoch_s
    from bftrainer.milp import ProblemError, check_speedup

    seen: dict[str, int] = {}
    for i, job in enumerate(jobs):
        where = f"job {i + 1} ({job.id!r})"
        if not isinstance(job.id, str) or not job.id:
            raise JobSpecError(f"job {i + 1}: the id is empty")
        if job.id in seen:
            raise JobSpecError(f"{where}: id {job.id!r} also names job {seen[job.id] + 1}")
        seen[job.id] = i
        if not (math.isfinite(job.work_samples) and job.work_samples > 0):
            raise JobSpecError(f"{where}: work is {job.work_samples!r} samples, expected > 0")
        try:
            check_epoch_s(job.submit_s)
            spec = job.trainer_spec()
            if speedup:
                check_speedup(spec)
        except (ProblemError, ValueError) as e:
            reason = str(e).split(": ", 1)[-1] if str(e).startswith("trainer ") else str(e)
            raise JobSpecError(f"{where}: {reason}") from None
