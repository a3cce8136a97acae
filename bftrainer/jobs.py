"""The training job as every part of bftrainer sees it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class JobSpec:
    """A training job: what it needs, when it arrives, how it scales.

    ``curve``: throughput breakpoints ``(nodes, samples/s)``; ``work_samples``: samples to
    process before it completes.
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

    @cached_property
    def breakpoints(self) -> tuple[np.ndarray, np.ndarray]:
        """The curve with (0, 0) prepended, built once: replays read it at every event."""
        xs = np.array([0.0] + [n for n, _ in self.curve])
        ys = np.array([0.0] + [v for _, v in self.curve])
        return xs, ys

    def rate_sps(self, nodes: int) -> float:
        """Throughput at ``nodes`` nodes, linear between breakpoints, 0 at 0."""
        if nodes <= 0:
            return 0.0
        xs, ys = self.breakpoints
        return float(np.interp(nodes, xs, ys))
