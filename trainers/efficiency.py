"""Statistical efficiency of a total batch size (Pollux, OSDI'21, §3.1).

Equation labels (E), (G), (T1)-(T4) are those of docs/goodput.md.

Pollux measures training progress in steps of the *base* batch size M0 (the batch size
the user tuned the learning rate for). One step at a larger batch M is worth ``gain``
base steps, less than M / M0 when the gradient is not noisy:

    gain(M)       = (phi + M0) * M / ((phi + M) * M0)      (= AdaScale's gain ratio r)
    EFFICIENCY(M) = gain(M) / (M / M0) = (phi + M0) / (phi + M),   M >= M0

where phi is the pre-conditioned gradient noise scale (PGNS) in samples, see
:mod:`bftrainer.trainers.gns`. phi = inf (pure noise) gives efficiency 1 at every M;
phi = 0 (no noise) gives M0 / M, i.e. a bigger batch buys nothing.
"""

from __future__ import annotations

import logging
import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

logger = logging.getLogger(__name__)


class BatchBelowBaseError(ValueError):
    """A total batch below the base batch M0, where Pollux's efficiency is not defined."""


def _check(batch_size: NDArray[np.float64], base_batch_size: float, pgns: float) -> None:
    if not base_batch_size > 0:
        raise ValueError(f"base batch size must be > 0, got {base_batch_size!r}")
    if math.isnan(pgns) or pgns < 0:
        raise ValueError(f"PGNS must be >= 0 (or inf), got {pgns!r}")
    if np.any(batch_size < base_batch_size):
        low = float(np.min(batch_size))
        raise BatchBelowBaseError(f"batch size {low:g} is below the base batch {base_batch_size:g}")


def efficiency(batch_size: ArrayLike, base_batch_size: float, pgns: float) -> NDArray[np.float64]:
    """EFFICIENCY(M) = (phi + M0) / (phi + M) for every M in ``batch_size``, (E)."""
    m = np.asarray(batch_size, dtype=float)
    _check(m, base_batch_size, pgns)
    if math.isinf(pgns):
        return np.ones_like(m)
    return np.asarray((pgns + base_batch_size) / (pgns + m), dtype=float)


def gain(batch_size: ArrayLike, base_batch_size: float, pgns: float) -> NDArray[np.float64]:
    """Base-batch steps that one step at batch M is worth: (M / M0) * EFFICIENCY(M)."""
    m = np.asarray(batch_size, dtype=float)
    return np.asarray(m / base_batch_size * efficiency(m, base_batch_size, pgns), dtype=float)


def step_gain(batch_size: int, base_batch_size: int, pgns: float | None) -> float:
    """Scalar gain of one step, for per-step use (no numpy, a microsecond).

    Conventions where (E) does not apply: below M0 every sample counts (M / M0); an
    unmeasured PGNS (None) counts a step as one base step (AdaScale's r = 1).
    """
    if batch_size <= base_batch_size:
        return batch_size / base_batch_size
    if pgns is None:
        return 1.0
    if math.isinf(pgns):
        return batch_size / base_batch_size
    return batch_size / base_batch_size * (pgns + base_batch_size) / (pgns + batch_size)


def pgns_from_stats(grad_sqr: float, grad_var: float) -> float:
    """phi = tr(P Sigma P) / |P g|^2 from per-sample statistics; inf when |P g|^2 <= 0.

    An estimated |g|^2 at or below zero means the noise swamps the signal: every batch
    size is then fully efficient, which is the limit phi -> inf.
    """
    if grad_var <= 0:
        return 0.0
    if grad_sqr <= 0:
        return math.inf
    return grad_var / grad_sqr
