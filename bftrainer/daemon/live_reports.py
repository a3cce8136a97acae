"""A live trainer's reports, as the daemon reads and records them: how far each
trainer's ``metrics.jsonl`` is read (:class:`ReportReader`), and each metrics record:
progress and rates in the store, and the curves the loop plans on (throughput learnt
from the rates measured, goodput from the trainer's own Pollux model) as reports for
the loop (:func:`record_metrics`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from bftrainer.loop import CurveReport
from bftrainer.loop.jobs import job_of
from bftrainer.service.curves import LiveCurves
from bftrainer.state import Store, TrainerRow
from bftrainer.trainers import channel
from bftrainer.trainers.metrics import MetricsRecord, MetricsRecordError

log = logging.getLogger(__name__)


class ReportReader:
    """What the live driver has read of each trainer's ``metrics.jsonl``: how far, and
    the samples reported so far; each new line recorded (:func:`record_metrics`)."""

    def __init__(self, store: Store, curves: LiveCurves) -> None:
        self.store = store
        self.curves = curves
        self._offsets: dict[str, int] = {}
        self._samples: dict[str, int] = {}

    def from_start(self, trainer_id: str, samples_done: int | None = None) -> None:
        """Read the trainer's reports from their first line again; ``samples_done``: the
        samples the store has of it, where the count starts over too."""
        if samples_done is not None:
            self._samples[trainer_id] = samples_done
        self._offsets[trainer_id] = 0

    def read(self, trainer_id: str, trainer_dir: Path) -> tuple[float, list[CurveReport]]:
        """New lines of the trainer's ``metrics.jsonl`` (progress, batch size, curves):
        the samples gained since the last read, and the curve reports they bring."""
        records, self._offsets[trainer_id] = channel.read_metrics(
            trainer_dir, self._offsets.get(trainer_id, 0)
        )
        before = self._samples.get(trainer_id, 0)
        row = self.store.trainer(trainer_id)
        reports: list[CurveReport] = []
        for rec in records:
            kind = rec.get("kind")
            if kind == "reset":
                batch = rec.get("batch_size")
                if isinstance(batch, int):
                    self.store.update_progress(trainer_id, batch_size=batch)
            elif kind == "metrics":
                samples = rec.get("samples_done")
                if isinstance(samples, int):
                    self._samples[trainer_id] = max(self._samples.get(trainer_id, 0), samples)
                reports += record_metrics(
                    self.store, self.curves, row, rec, self._samples.get(trainer_id)
                )
        return float(max(0, self._samples.get(trainer_id, 0) - before)), reports

    def forget(self, trainer_id: str) -> None:
        """Drop what was read of a finished trainer (the store keeps its figures): a
        daemon's memory does not grow with every trainer it ever ran."""
        self._offsets.pop(trainer_id, None)
        self._samples.pop(trainer_id, None)
        self.curves.forget(trainer_id)


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
