"""The daemon's queue: trainers submitted and cancels requested through the store.

``bftrainer submit`` and ``cancel`` write the store from other processes; this source
hands each to the loop once, on the trainer's prior curve (or its measured one). It also
reads, at each step, the promise a search campaign marked on its trials (the rungs
passed), which milp weighs when ``[daemon] search_promise`` is on (:meth:`weight`).
"""

from __future__ import annotations

from collections.abc import Sequence

from bftrainer.common.promise import promise_weight
from bftrainer.loop import Arrival, Cancel, CurveReport, Polled
from bftrainer.loop.jobs import job_of
from bftrainer.service.curves import LiveCurves
from bftrainer.state import Store

UNFINISHED = ("queued", "running", "waiting")


class SubmissionQueue:
    """Trainers submitted and cancels requested through the store, each delivered once."""

    def __init__(
        self,
        store: Store,
        known: Sequence[str] = (),
        curves: LiveCurves | None = None,
        promise: float = 1.0,
    ) -> None:
        self.store = store
        self.known: set[str] = set(known)
        self.cancelled: set[str] = set()
        self.curves = curves or LiveCurves()
        self.promise = promise
        self.rungs: dict[str, int] = {}  # unfinished trainers' marks, read at each step

    def poll(self, now_s: float) -> Polled:
        """New trainers on their prior; waiting trainers' priors restated where the best
        measured rate rose (as the replay's ``PriorArrivals``)."""
        inputs: list[Arrival | Cancel | CurveReport] = list(self.curves.restated())
        rows = self.store.trainers(UNFINISHED)
        self.rungs = {row.id: row.rungs for row in rows if row.rungs}
        for row in rows:
            if row.id not in self.known:
                self.known.add(row.id)
                inputs.append(Arrival(self.curves.prior_job(job_of(row))))
            if row.cancel_requested and row.id not in self.cancelled:
                self.cancelled.add(row.id)
                inputs.append(Cancel(row.id))
        return Polled(tuple(inputs))

    def weight(self, trainer_id: str) -> float:
        """A trainer's weight on its term of milp's objective (``MilpPolicy.weights``):
        ``search_promise ** rungs`` from the marks read at this step, as the replay's
        ``SearchSource.weight``; 1 for a trainer no campaign marked."""
        return promise_weight(self.promise, self.rungs.get(trainer_id, 0))
