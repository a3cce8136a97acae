"""The daemon's queue: trainers submitted and cancels requested through the store.

``bftrainer submit`` and ``cancel`` write the store from other processes; this source
hands each to the loop once, on the trainer's prior curve (or its measured one).
"""

from __future__ import annotations

from collections.abc import Sequence

from bftrainer.live_curves import LiveCurves, job_of
from bftrainer.loop import Arrival, Cancel, CurveReport, Polled
from bftrainer.state import Store

UNFINISHED = ("queued", "running", "waiting")


class SubmissionQueue:
    """Trainers submitted and cancels requested through the store, each delivered once."""

    def __init__(
        self, store: Store, known: Sequence[str] = (), curves: LiveCurves | None = None
    ) -> None:
        self.store = store
        self.known: set[str] = set(known)
        self.cancelled: set[str] = set()
        self.curves = curves or LiveCurves()

    def poll(self, now_s: float) -> Polled:
        """New trainers on their prior; waiting trainers' priors restated where the best
        measured rate rose (as the replay's ``PriorArrivals``)."""
        inputs: list[Arrival | Cancel | CurveReport] = list(self.curves.restated())
        for row in self.store.trainers(UNFINISHED):
            if row.id not in self.known:
                self.known.add(row.id)
                inputs.append(Arrival(self.curves.prior_job(job_of(row))))
            if row.cancel_requested and row.id not in self.cancelled:
                self.cancelled.add(row.id)
                inputs.append(Cancel(row.id))
        return Polled(tuple(inputs))
