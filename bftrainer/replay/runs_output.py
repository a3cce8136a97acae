"""Every file a ``bftrainer replay`` command writes into its --out folder: each run's
files (bftrainer/replay/output.py, and Pollux's), with several runs a folder each and
a top-level summary.json listing them, and the figures over all runs.

A figure that cannot be drawn costs that figure only: hours of replay are in the
summaries and CSV files whatever a plot does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bftrainer.common import strict_json
from bftrainer.replay.output import write_result
from bftrainer.replay.plots import plot_costs, plot_sweep, plot_windows
from bftrainer.replay.pollux.output import write_pollux_outputs
from bftrainer.replay.pollux.plots import plot_efficiency
from bftrainer.replay.pollux.sim import PolluxReport
from bftrainer.replay.run import ReplayResult
from bftrainer.replay.sweep import run_label

log = logging.getLogger(__name__)


def write_outputs(
    out_dir: Path,
    results: list[ReplayResult],
    reports: list[tuple[ReplayResult, PolluxReport]],
    sweep: bool,
    nested: bool,
) -> None:
    """Every output file, into ``out_dir`` (a fresh folder: see cli/outdir.py); with
    ``nested``, each run in its own folder (several runs asked for, even if some failed)."""
    if not nested:
        write_result(results[0], out_dir)
    else:
        for r in results:
            write_result(r, out_dir / run_label(r))
        runs = [json.loads((out_dir / run_label(r) / "summary.json").read_text()) for r in results]
        (out_dir / "summary.json").write_text(strict_json.dumps({"runs": runs}, indent=2) + "\n")
    _plot(plot_windows, results, out_dir / "utilization_per_window.png")
    _plot(plot_costs, results, out_dir / "costs.png")
    if sweep:
        _plot(plot_sweep, results, out_dir / "utilization_vs_tfwd.png")
    for r, rep in reports:
        write_pollux_outputs(r.trainers, rep, out_dir / run_label(r) if nested else out_dir)
    if len(reports) > 1:
        efficiency = [(run_label(r), rep) for r, rep in reports]
        _plot(plot_efficiency, efficiency, out_dir / "efficiency.png")


def _plot(draw: Callable[[Any, Path], object], data: Any, path: Path) -> None:
    """A figure that cannot be drawn costs that figure only: the runs' results (hours of
    work, all in summary.json and the CSVs) are written whatever a plot does."""
    try:
        draw(data, path)
    except Exception as exc:
        log.error("%s not written: %r (the figures are in the CSV files)", path.name, exc)
