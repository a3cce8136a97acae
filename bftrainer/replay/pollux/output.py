"""What a Pollux replay writes and prints: JCT summary, per-trainer CSV, series, table.

Beside the plain replay's files (``bftrainer.replay.output``): ``efficiency.csv``,
``pollux_trainers.csv`` and ``efficiency.png``, the summary fields of
docs/goodput-replay.md, and the short table printed after the plain one.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bftrainer.idle_monitor.trace import format_time
from bftrainer.loop import TrainerState
from bftrainer.replay.output import align_columns
from bftrainer.replay.pollux.plots import plot_efficiency
from bftrainer.replay.pollux.trainer import PolluxReport


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
    return align_columns([[name] + [fmt(s, label) for label, s in runs] for name, fmt in rows])
