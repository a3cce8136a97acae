"""Pre-conditioned gradient noise scale (PGNS): unbiased estimators and smoothing.

Conventions, used by every module of ``bftrainer.trainers``:

* ``grad_sqr`` is |P g|^2, the squared norm of the true (whole-data) gradient g after
  the pre-conditioner P (identity for SGD, ``1 / (sqrt(v_hat) + eps)`` for Adam).
* ``grad_var`` is tr(P Sigma P), the trace of the **per-sample** gradient covariance
  Sigma after P. A gradient averaged over b samples has covariance Sigma / b.
* PGNS phi = grad_var / grad_sqr, in samples (McCandlish et al. 2018's B_simple with a
  pre-conditioner; Pollux §3.1).

Pollux's own profiles store the variance at the base batch M0 (tr Sigma / M0); multiply
by M0 to get ``grad_var`` here (see :mod:`bftrainer.trainers.pollux_profiles`).

Estimators (Pollux §3.1, McCandlish et al. App. A). K gradient *groups* of b samples
each (replicas, or micro-batches of gradient accumulation), B = K b:

    L = mean_k |P g_k|^2,  G = |P mean_k g_k|^2
    E[L] = |Pg|^2 + tr(P Sigma P) / b,   E[G] = |Pg|^2 + tr(P Sigma P) / B
    => |Pg|^2 = (K G - L) / (K - 1),     tr(P Sigma P) = b K (L - G) / (K - 1)

With one group per step (one replica, no accumulation) the *differenced* estimator pairs
two consecutive steps' gradients g1 (b1 samples) and g2 (b2 samples), treating the true
gradient as unchanged between them: E[g1 . g2] = |Pg|^2 and
E|g1 - g2|^2 = tr(P Sigma P) (1/b1 + 1/b2).

One step's estimates are very noisy (|Pg|^2 can come out negative), so both are smoothed
by an exponential moving average with bias correction (Adam's), whose decay per
estimate is ``smoothing ** (samples / M0)``, ``samples`` being the training samples the
estimate stands for: the memory is about ``M0 / (1 - smoothing)`` samples whatever the
batch size and however often gradients are measured. PGNS is the ratio of the two
smoothed values, not a smoothed ratio, which would be biased.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bftrainer.trainers.efficiency import pgns_from_stats

logger = logging.getLogger(__name__)

Vector = NDArray[np.floating]
Preconditioner = Callable[[Vector], Vector]
"""Maps a flat gradient to P times it; the hook for Adam-like optimisers."""

DEFAULT_SMOOTHING = 0.999  # as Pollux: about 1000 base-batch steps of memory


class GradientShapeError(ValueError):
    """Gradient groups of different shapes, or an empty list of groups."""


def identity(grad: Vector) -> Vector:
    """The SGD pre-conditioner, P = I."""
    return grad


def diagonal_preconditioner(scale: Vector) -> Preconditioner:
    """P = diag(scale): multiplies every gradient element by its own factor."""
    s = np.asarray(scale, dtype=float)

    def apply(grad: Vector) -> Vector:
        return np.asarray(grad * s)

    return apply


def adam_preconditioner(
    exp_avg_sq: Vector, step: int, beta2: float = 0.999, eps: float = 1e-8
) -> Preconditioner:
    """Adam's P = diag(1 / (sqrt(v_hat) + eps)), with v_hat = v / (1 - beta2^step).

    ``exp_avg_sq`` is the optimiser's running second moment v after ``step`` updates;
    Adam applies P to the gradient, so the noise that matters is that of P g.
    """
    if step < 1:
        raise ValueError(f"Adam step must be >= 1 to have a second moment, got {step}")
    v_hat = np.asarray(exp_avg_sq, dtype=float) / (1.0 - beta2**step)
    return diagonal_preconditioner(1.0 / (np.sqrt(v_hat) + eps))


@dataclass(frozen=True)
class GradientSample:
    """One step's unbiased estimates: ``grad_sqr`` = |Pg|^2, ``grad_var`` = tr(P Sigma P).

    ``batch_size`` is the number of samples the estimate used (K b, or b1 + b2 when
    differenced); it sets the sample's weight in the moving average.
    """

    grad_sqr: float
    grad_var: float
    batch_size: int


def from_group_norms(
    local_sqr_mean: float, total_sqr: float, groups: int, group_bsz: int
) -> GradientSample:
    """Unbiased estimates from K >= 2 groups: L = mean local |Pg_k|^2, G = |P mean g_k|^2.

    This is the form a data-parallel trainer uses: each replica knows its own |Pg_k|^2
    (one scalar all-reduce gives L) and every replica has the averaged gradient.
    """
    if groups < 2:
        raise ValueError(f"need >= 2 gradient groups for the group estimator, got {groups}")
    if group_bsz < 1:
        raise ValueError(f"group batch size must be >= 1, got {group_bsz}")
    k = float(groups)
    grad_sqr = (k * total_sqr - local_sqr_mean) / (k - 1.0)
    grad_var = group_bsz * k * (local_sqr_mean - total_sqr) / (k - 1.0)
    return GradientSample(grad_sqr, grad_var, groups * group_bsz)


def from_consecutive(
    prev_sqr: float, sqr: float, dot: float, prev_bsz: int, bsz: int
) -> GradientSample:
    """Differenced estimates from two consecutive one-group steps g1, g2 (|.|^2 and g1.g2).

    |Pg|^2 = g1 . g2 and tr(P Sigma P) = |g1 - g2|^2 / (1/b1 + 1/b2), both unbiased when
    the true gradient did not move between the two steps.
    """
    if prev_bsz < 1 or bsz < 1:
        raise ValueError(f"batch sizes must be >= 1, got {prev_bsz} and {bsz}")
    diff_sqr = prev_sqr + sqr - 2.0 * dot
    grad_var = diff_sqr / (1.0 / prev_bsz + 1.0 / bsz)
    return GradientSample(dot, grad_var, prev_bsz + bsz)


class ExponentialAverage:
    """An exponential moving average with bias correction (as Adam's moments).

    ``update(x, weight)`` decays the old value by ``decay ** weight``; the correction
    divides by the total weight given to real samples, so the first update is exact.
    """

    def __init__(self, decay: float) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay!r}")
        self.decay = decay
        self._biased = 0.0
        self._norm = 0.0

    def update(self, value: float, weight: float = 1.0) -> None:
        d = self.decay**weight
        self._biased = d * self._biased + (1.0 - d) * value
        self._norm = d * self._norm + (1.0 - d)

    @property
    def value(self) -> float | None:
        """The bias-corrected average, None before the first update."""
        return self._biased / self._norm if self._norm > 0 else None

    def state(self) -> tuple[float, float]:
        """(biased sum, weight) from which :meth:`restore` rebuilds the average."""
        return self._biased, self._norm

    def restore(self, state: tuple[float, float]) -> None:
        self._biased, self._norm = float(state[0]), float(state[1])


class GradientNoiseScale:
    """Smoothed |Pg|^2 and tr(P Sigma P) from per-step gradient samples; PGNS on demand.

    ``base_batch_size`` (M0) scales the smoothing: an estimate standing for B samples
    decays the average by ``smoothing ** (B / M0)``. Feed it scalar norms
    (:meth:`update_from_norms`) or flat gradient arrays (:meth:`observe`); with one
    group per step it keeps the previous step's pre-conditioned gradient for the
    differenced estimator.
    """

    def __init__(self, base_batch_size: int, smoothing: float = DEFAULT_SMOOTHING) -> None:
        if base_batch_size < 1:
            raise ValueError(f"base batch size must be >= 1, got {base_batch_size}")
        self.base_batch_size = base_batch_size
        self._sqr = ExponentialAverage(smoothing)
        self._var = ExponentialAverage(smoothing)
        self._prev: tuple[Vector, float, int] | None = None  # (P g, |P g|^2, b)
        self._prev_norms: tuple[float, int] | None = None  # scalar path: (|P g|^2, b)
        self.samples = 0
        self._pgns: float | None = None

    def update(self, sample: GradientSample, weight_samples: float | None = None) -> None:
        """Fold one estimate into the moving averages.

        ``weight_samples`` is how many training samples the estimate stands for (default
        its own ``batch_size``): a pair of overlapping consecutive steps brings one new
        step of data; an estimate taken once every k steps stands for k steps.
        """
        if not (math.isfinite(sample.grad_sqr) and math.isfinite(sample.grad_var)):
            logger.warning("ignoring a non-finite gradient sample %s", sample)
            return
        samples = sample.batch_size if weight_samples is None else weight_samples
        weight = samples / self.base_batch_size
        self._sqr.update(sample.grad_sqr, weight)
        self._var.update(sample.grad_var, weight)
        self.samples += 1
        sqr, var = self.grad_sqr, self.grad_var
        assert sqr is not None and var is not None
        self._pgns = pgns_from_stats(sqr, var)  # kept: read every step by the agent

    def update_from_norms(
        self, local_sqr_mean: float, total_sqr: float, groups: int, group_bsz: int
    ) -> None:
        """One step of a K-group trainer: L, G as in :func:`from_group_norms`."""
        self.update(from_group_norms(local_sqr_mean, total_sqr, groups, group_bsz))

    def update_from_consecutive(self, sqr: float, dot_prev: float, bsz: int) -> None:
        """One step of a one-group trainer given |Pg_t|^2 and Pg_t . Pg_{t-1}.

        The first call only remembers |Pg_t|^2; ``dot_prev`` is ignored then.
        """
        if self._prev_norms is not None:
            prev_sqr, prev_bsz = self._prev_norms
            self.update(from_consecutive(prev_sqr, sqr, dot_prev, prev_bsz, bsz), bsz)
        self._prev_norms = (sqr, bsz)

    def observe(
        self,
        groups: Sequence[Vector],
        group_bsz: int,
        preconditioner: Preconditioner = identity,
    ) -> None:
        """One step from the flat gradients of its K groups (each over ``group_bsz``).

        K >= 2 uses the group estimator; K = 1 the differenced one against the previous
        call's gradient (kept pre-conditioned, so one extra gradient of memory).
        """
        if not groups:
            raise GradientShapeError("no gradient groups given")
        shape = np.shape(groups[0])
        if any(np.shape(g) != shape for g in groups):
            shapes = sorted({np.shape(g) for g in groups})
            raise GradientShapeError(f"gradient groups differ in shape: {shapes}")
        pre = [np.asarray(preconditioner(np.asarray(g, dtype=float))) for g in groups]
        if len(pre) >= 2:
            local = float(np.mean([np.dot(p, p) for p in pre]))
            avg = np.mean(pre, axis=0)
            self.update(from_group_norms(local, float(np.dot(avg, avg)), len(pre), group_bsz))
            self._prev = None
            return
        g = pre[0]
        sqr = float(np.dot(g, g))
        if self._prev is not None and self._prev[0].shape == g.shape:
            prev, prev_sqr, prev_bsz = self._prev
            dot = float(np.dot(prev, g))
            self.update(from_consecutive(prev_sqr, sqr, dot, prev_bsz, group_bsz), group_bsz)
        self._prev = (g.copy(), sqr, group_bsz)

    def state(self) -> dict[str, Any]:
        """The smoothed averages as plain data (JSON-able), for a restarted process."""
        return {
            "sqr": list(self._sqr.state()),
            "var": list(self._var.state()),
            "samples": self.samples,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` of an earlier estimator (same M0 and smoothing)."""
        self._sqr.restore(tuple(state["sqr"]))
        self._var.restore(tuple(state["var"]))
        self.samples = int(state["samples"])
        sqr, var = self.grad_sqr, self.grad_var
        self._pgns = None if sqr is None or var is None else pgns_from_stats(sqr, var)
        self.reset_pairing()

    def reset_pairing(self) -> None:
        """Forget the previous gradient (after a rescale or a restart of the step loop)."""
        self._prev = None
        self._prev_norms = None

    @property
    def grad_sqr(self) -> float | None:
        """Smoothed |Pg|^2, clamped at 0; None before the first sample."""
        v = self._sqr.value
        return None if v is None else max(v, 0.0)

    @property
    def grad_var(self) -> float | None:
        """Smoothed per-sample tr(P Sigma P), clamped at 0; None before the first sample."""
        v = self._var.value
        return None if v is None else max(v, 0.0)

    @property
    def pgns(self) -> float | None:
        """phi = grad_var / grad_sqr in samples (inf when |Pg|^2 <= 0); None if unknown."""
        return self._pgns
