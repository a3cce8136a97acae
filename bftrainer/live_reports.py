"""A live trainer's metrics record, as the daemon records it: progress and rates in the
store, and the curves the loop plans on (throughput learnt from the rates measured,
goodput from the trainer's own Pollux model) as reports for the loop."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from bftrainer.jobs import job_of
from bftrainer.live_curves import LiveCurves
from bftrainer.loop import CurveReport
from bftrainer.state import Store, TrainerRow
from bftrainer.trainers.metrics import MetricsRecord, MetricsRecordError

log = logging.getLogger(__name__)


def record_metrics(
    store: Store,
    curves: LiveCurves,
    row: TrainerRow,
    rec: Mapping[str, object],
    samples_done: int | None,
) -> list[CurveReport]:
    """Record one ``metrics`` line of trainer ``row`` (its samples so far:
    ``samples_done``); the curve reports it brings. A bad record is one line, ignored."""
    trainer_id = row.id
    try:
        record = MetricsRecord.from_dict(rec.get("record"), f"trainer {trainer_id}")
    except MetricsRecordError as exc:
        log.warning("trainer %s: ignoring a bad metrics record: %s", trainer_id, exc)
        return []
    reports: list[CurveReport] = []
    throughput = goodput = None
    # Throughput: the rates measured at the counts it ran, and the replay's prior.
    learned = curves.measured(job_of(row), record)
    if learned is not None:
        reports.append(CurveReport(trainer_id, "throughput", learned))
    if record.throughput is not None:  # goodput: the trainer's own Pollux model
        try:
            model = record.goodput_model()
            good, thr = model.allocator_curves(row.n_max)
        except (MetricsRecordError, ValueError) as exc:
            log.warning("trainer %s: no goodput curve from its record: %s", trainer_id, exc)
        else:
            reports.append(CurveReport(trainer_id, "goodput", good))
            n = max(1, record.nodes)
            throughput = float(_at(thr, n))
            goodput = float(_at(good, n))
    store.update_progress(
        trainer_id,
        samples_done=samples_done,
        throughput_sps=throughput,
        goodput_sps=goodput,
        batch_size=record.batch_size,
    )
    store.add_metric(trainer_id, record.to_dict(), now_s=record.time_s)
    return reports


def _at(curve: Sequence[tuple[float, float]], n: int) -> float:
    for x, y in curve:
        if x >= n:
            return y
    return curve[-1][1] if curve else 0.0
