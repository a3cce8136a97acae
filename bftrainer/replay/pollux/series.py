"""The efficiency time series of a Pollux replay: constant-rate stretches into hourly bins.

The driver adds every stretch a trainer ran at one rate (its nodes, samples/s, useful
samples/s, statistical efficiency and batch size); the series spreads it over the bins
it covers and gives one row per bin, as ``efficiency.csv`` holds them
(docs/goodput-replay.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bftrainer.idle_monitor.trace import format_time


@dataclass
class _Bin:
    trainer_s: float = 0.0
    node_s: float = 0.0
    samples: float = 0.0
    statistical_samples: float = 0.0
    efficiency_s: float = 0.0
    batch_s: float = 0.0


def ratio(a: float, b: float) -> float | None:
    """a / b, or None when nothing was counted (b <= 0)."""
    return a / b if b > 0 else None


class EfficiencySeries:
    """Bins of ``width_s`` seconds from the first stretch's start (or ``origin_s``)."""

    def __init__(self, width_s: float) -> None:
        self.width_s = width_s
        self.origin_s: float | None = None
        self._bins: dict[int, _Bin] = {}

    def add(
        self,
        t0_s: float,
        duration_s: float,
        nodes: int,
        samples_sps: float,
        statistical_sps: float,
        efficiency: float,
        batch_size: int,
    ) -> None:
        """Spread one constant-rate stretch over the bins it covers."""
        if self.origin_s is None:
            self.origin_s = t0_s
        origin, width = self.origin_s, self.width_s
        t, end = t0_s, t0_s + duration_s
        while t < end:
            k = int((t - origin) // width)
            stop = min(end, origin + (k + 1) * width)
            d = stop - t
            b = self._bins.setdefault(k, _Bin())
            b.trainer_s += d
            b.node_s += nodes * d
            b.samples += samples_sps * d
            b.statistical_samples += statistical_sps * d
            b.efficiency_s += efficiency * d
            b.batch_s += batch_size * d
            if stop <= t:  # float guard: never loop on a zero-width step
                break
            t = stop

    def rows(self, end_s: float) -> list[dict[str, Any]]:
        """One row per bin up to ``end_s`` (the last one may be shorter)."""
        width = self.width_s
        origin = self.origin_s if self.origin_s is not None else end_s
        series = []
        for k in sorted(self._bins):
            b = self._bins[k]
            start = origin + k * width
            length = max(min(width, end_s - start), 1e-9)
            series.append(
                {
                    "start": format_time(start),
                    "hours": k * width / 3600,
                    "running_trainers": b.trainer_s / length,
                    "nodes": b.node_s / length,
                    "samples_processed": b.samples,
                    "statistical_samples": b.statistical_samples,
                    "efficiency_samples": ratio(b.statistical_samples, b.samples),
                    "efficiency_mean": ratio(b.efficiency_s, b.trainer_s),
                    "mean_batch_size": ratio(b.batch_s, b.trainer_s),
                    "goodput_sps": b.statistical_samples / length,
                }
            )
        return series
