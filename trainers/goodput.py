"""Goodput of a configuration, the best configuration per node count, and the curve.

Pollux (OSDI'21, §3 and §4.1), (G): GOODPUT = THROUGHPUT x EFFICIENCY, in samples per second
counted at the statistical value of the base batch M0. For n nodes with r replicas
each (K = n r), local batch m and s extra accumulation micro-steps:

    M          = K m (s + 1)
    THROUGHPUT = M / T_step(n, K, m, s)        (samples/s; throughput.py, (T4))
    EFFICIENCY = (phi + M0) / (phi + M)        (efficiency.py, (E))

:meth:`GoodputModel.best_config` maximises it over integer (m, s) under the per-replica
memory bound ``max_local_bsz``, the user's batch limits M0 <= M <= ``max_batch_size``
and ``max_accum_steps``. For fixed (n, s), goodput is quasi-concave in m (its
super-level sets {m : t T_step(m) (phi + c m) <= m} are intervals because T_step is
convex and increasing in m), so a ternary search over the integers finds the exact
optimum for each s; all node counts and all s are searched at once with numpy.

:meth:`GoodputModel.curve` turns the best goodput per node count into the breakpoints
``[(nodes, goodput_per_s), ...]`` that the allocator takes (milp's ``TrainerSpec.curve``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from bftrainer.trainers.efficiency import efficiency
from bftrainer.trainers.learned_curve import EXPLORATION_GROWTH
from bftrainer.trainers.throughput import ThroughputModel, ThroughputParams, predict_step_time

logger = logging.getLogger(__name__)

DEFAULT_MAX_ACCUM_STEPS = 15
# Re-tuning between rescales: move to the best batch only when the model promises this
# much more goodput (AdaptDL's 5%; the step-time model errs by about 5-9%, and every new
# configuration costs warm-up steps and a refit).
DEFAULT_SWITCH_GAIN = 0.05


class BatchLimitsError(ValueError):
    """Inconsistent batch-size limits (the message names the field and value)."""


class NoFeasibleConfigError(ValueError):
    """No (local batch, accumulation) fits the limits at this node count."""


@dataclass(frozen=True)
class BatchLimits:
    """The user's batch-size limits and the memory bound.

    ``base_batch_size`` is M0, the batch the learning rate was tuned for and the smallest
    total batch allowed; ``max_batch_size`` the largest total batch the user accepts;
    ``min_local_bsz``/``max_local_bsz`` bound the samples per replica per micro-step
    (the upper one is the memory bound); ``max_accum_steps`` bounds s.
    """

    base_batch_size: int
    max_batch_size: int
    max_local_bsz: int
    min_local_bsz: int = 1
    max_accum_steps: int = DEFAULT_MAX_ACCUM_STEPS

    def __post_init__(self) -> None:
        for name in ("base_batch_size", "max_batch_size", "max_local_bsz", "min_local_bsz"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise BatchLimitsError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.max_accum_steps, int) or self.max_accum_steps < 0:
            raise BatchLimitsError(
                f"max_accum_steps must be an integer >= 0, got {self.max_accum_steps!r}"
            )
        if self.max_batch_size < self.base_batch_size:
            raise BatchLimitsError(
                f"max_batch_size {self.max_batch_size} < base_batch_size {self.base_batch_size}"
            )
        if self.max_local_bsz < self.min_local_bsz:
            raise BatchLimitsError(
                f"max_local_bsz {self.max_local_bsz} < min_local_bsz {self.min_local_bsz}"
            )


@dataclass(frozen=True)
class GoodputConfig:
    """The best configuration at ``nodes`` and what the model predicts for it."""

    nodes: int
    replicas: int
    local_bsz: int
    accum_steps: int
    batch_size: int
    step_time_s: float
    throughput_sps: float
    efficiency: float
    goodput_sps: float


class GoodputModel:
    """Goodput of one trainer from its fitted step-time model and its PGNS.

    ``max_nodes_seen`` (default: the throughput model's) sets Pollux's exploration cap:
    :meth:`node_limit` never exceeds ``EXPLORATION_GROWTH`` times it. ``pgns=None``
    (no gradient statistics yet) counts as phi = 0, the pessimistic end: no benefit
    from a larger batch until the noise has been measured.
    """

    def __init__(
        self,
        throughput: ThroughputModel | ThroughputParams,
        pgns: float | None,
        limits: BatchLimits,
        replicas_per_node: int = 1,
        max_nodes_seen: int | None = None,
    ) -> None:
        if replicas_per_node < 1:
            raise ValueError(f"replicas_per_node must be >= 1, got {replicas_per_node}")
        if pgns is not None and (math.isnan(pgns) or pgns < 0):
            raise ValueError(f"PGNS must be >= 0 (or inf), got {pgns!r}")
        if isinstance(throughput, ThroughputModel):
            self.params = throughput.params
            seen = throughput.max_nodes_seen if max_nodes_seen is None else max_nodes_seen
        else:
            self.params = throughput
            seen = max_nodes_seen
        self.max_nodes_seen = seen
        self.pgns = 0.0 if pgns is None else float(pgns)
        self.limits = limits
        self.replicas_per_node = replicas_per_node

    def goodput(
        self,
        nodes: ArrayLike,
        local_bsz: ArrayLike,
        accum_steps: ArrayLike = 0,
        replicas: ArrayLike | None = None,
    ) -> NDArray[np.float64]:
        """Goodput in samples/s (at the base batch's statistical value), (G);
        ``replicas`` default: nodes x replicas_per_node (else: slots shared nodes)."""
        n = np.asarray(nodes, dtype=float)
        m = np.asarray(local_bsz, dtype=float)
        s = np.asarray(accum_steps, dtype=float)
        k = n * self.replicas_per_node if replicas is None else np.asarray(replicas, float)
        batch = k * m * (s + 1.0)
        t = predict_step_time(self.params, n, k, m, s)
        eff = efficiency(batch, self.limits.base_batch_size, self.pgns)
        return np.asarray(batch / t * eff, dtype=float)

    def _goodput_unchecked(
        self, n: NDArray[np.int64], m: NDArray[np.int64], s: NDArray[np.int64], k: NDArray[np.int64]
    ) -> NDArray[np.float64]:
        """(G) without the M >= M0 check, for the search (infeasible cells are masked)."""
        batch = (k * m * (s + 1)).astype(float)
        t = predict_step_time(self.params, n, k, m, s)
        if math.isinf(self.pgns):
            return np.asarray(batch / t, dtype=float)
        m0 = self.limits.base_batch_size
        return np.asarray(batch / t * (self.pgns + m0) / (self.pgns + batch), dtype=float)

    def _local_range(
        self, replicas: NDArray[np.int64], accum: NDArray[np.int64]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Feasible local batches [lo, hi] per (replicas, accum); lo > hi when none."""
        lim = self.limits
        per_m = replicas * (accum + 1)  # M = per_m * m
        lo = np.maximum(lim.min_local_bsz, -(-lim.base_batch_size // per_m))
        hi = np.minimum(lim.max_local_bsz, lim.max_batch_size // per_m)
        return lo, hi

    def best_configs(
        self, nodes: Sequence[int], replicas: Sequence[int] | None = None
    ) -> list[GoodputConfig | None]:
        """The goodput-maximising (m, s) for every node count; None where none is feasible.
        ``replicas``: per node count (slots that share nodes); default nodes x r."""
        ns = np.asarray(nodes, dtype=np.int64)
        if ns.size == 0:
            return []
        if np.any(ns < 1):
            raise ValueError(f"node counts must be >= 1, got {int(ns.min())}")
        ks = ns * self.replicas_per_node if replicas is None else np.asarray(replicas, np.int64)
        accum = np.arange(self.limits.max_accum_steps + 1, dtype=np.int64)
        n_grid, s_grid = np.meshgrid(ns, accum, indexing="ij")  # shape (N, S)
        k_grid = np.broadcast_to(ks[:, None], n_grid.shape)
        lo, hi = self._local_range(k_grid, s_grid)
        feasible = lo <= hi
        lo = np.where(feasible, lo, 1)
        hi = np.where(feasible, hi, 1)

        def f(m: NDArray[np.int64]) -> NDArray[np.float64]:
            return self._goodput_unchecked(n_grid, m, s_grid, k_grid)

        # Ternary search on integers, exact for quasi-concave f (see module docstring).
        while np.any(hi - lo > 2):
            third = (hi - lo) // 3
            m1, m2 = lo + third, hi - third
            left_lower = f(m1) < f(m2)
            active = hi - lo > 2
            lo = np.where(active & left_lower, m1 + 1, lo)
            hi = np.where(active & ~left_lower, m2, hi)
        best_m = lo.copy()
        best_g = f(lo)
        for step in (1, 2):
            cand = np.minimum(lo + step, hi)
            g = f(cand)
            better = g > best_g
            best_m = np.where(better, cand, best_m)
            best_g = np.where(better, g, best_g)
        best_g = np.where(feasible, best_g, -np.inf)

        out: list[GoodputConfig | None] = []
        for i, n in enumerate(ns):
            j = int(np.argmax(best_g[i]))  # ties go to the fewest accumulation steps
            if not np.isfinite(best_g[i, j]):
                out.append(None)
                continue
            out.append(self._config(int(n), int(best_m[i, j]), int(accum[j]), int(ks[i])))
        return out

    def _config(self, n: int, m: int, s: int, k: int) -> GoodputConfig:
        batch = k * m * (s + 1)
        t = float(predict_step_time(self.params, n, k, m, s))
        eff = float(efficiency(batch, self.limits.base_batch_size, self.pgns))
        return GoodputConfig(
            nodes=n,
            replicas=k,
            local_bsz=m,
            accum_steps=s,
            batch_size=batch,
            step_time_s=t,
            throughput_sps=batch / t,
            efficiency=eff,
            goodput_sps=batch / t * eff,
        )

    def best_config(self, nodes: int) -> GoodputConfig:
        """The goodput-maximising local batch and accumulation steps on ``nodes`` nodes."""
        config = self.best_configs([nodes])[0]
        if config is None:
            raise NoFeasibleConfigError(self._why_infeasible(nodes))
        return config

    def _why_infeasible(self, nodes: int) -> str:
        lim = self.limits
        k = nodes * self.replicas_per_node
        if k * lim.min_local_bsz > lim.max_batch_size:
            return (
                f"{nodes} node(s) x {self.replicas_per_node} replica(s) x min_local_bsz "
                f"{lim.min_local_bsz} exceeds max_batch_size {lim.max_batch_size}"
            )
        return (
            f"{nodes} node(s) cannot reach base_batch_size {lim.base_batch_size} with "
            f"max_local_bsz {lim.max_local_bsz} and max_accum_steps {lim.max_accum_steps}"
        )

    def max_feasible_nodes(self) -> int:
        """The largest node count at which the smallest local batch stays within M_max."""
        lim = self.limits
        return lim.max_batch_size // (self.replicas_per_node * lim.min_local_bsz)

    def node_limit(self, n_min: int, n_max: int) -> int:
        """Largest node count worth giving: feasible, within n_max and the exploration cap.

        The cap is ``EXPLORATION_GROWTH`` x ``max_nodes_seen`` (never below ``n_min``);
        without a seen count there is no cap.
        """
        limit = min(n_max, self.max_feasible_nodes())
        if self.max_nodes_seen is not None:
            limit = min(limit, max(EXPLORATION_GROWTH * self.max_nodes_seen, n_min))
        return limit

    def curve(
        self, n_min: int, n_max: int, max_points: int | None = None
    ) -> list[tuple[int, float]]:
        """Breakpoints ``[(nodes, goodput_per_s), ...]`` over ``n_min..n_max``.

        Each node count up to :meth:`node_limit` gets its best configuration's goodput,
        0 where no configuration fits the batch limits (possible only with tight limits,
        or below the node count that can reach M0). Past the limit the curve stays flat
        (one last breakpoint at ``n_max``), so the allocator sees no gain there; callers
        that can should also cap the trainer's n_max at ``node_limit``.

        ``max_points`` thins the breakpoints, keeping both ends and the points that
        linear interpolation between the kept ones would miss most.
        """
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        if max_points is not None and max_points < 2:
            raise ValueError(f"max_points must be >= 2, got {max_points}")
        limit = self.node_limit(n_min, n_max)
        if limit < n_min:
            raise NoFeasibleConfigError(self._why_infeasible(n_min))
        nodes = list(range(n_min, limit + 1))
        configs = self.best_configs(nodes)
        feasible = [c for c in configs if c is not None]
        if not feasible:
            raise NoFeasibleConfigError(self._why_infeasible(n_min))
        # A node count with no feasible configuration is worth nothing to this trainer.
        points = [
            (n, 0.0 if c is None else c.goodput_sps) for n, c in zip(nodes, configs, strict=True)
        ]
        if limit < n_max:
            points.append((n_max, feasible[-1].goodput_sps))
        if max_points is not None and len(points) > max_points:
            points = _thin(points, max_points)
        return points

    def allocator_curves(
        self, n_max: int
    ) -> tuple[tuple[tuple[float, float], ...], tuple[tuple[float, float], ...]]:
        """(goodput, throughput) breakpoints over 1..``n_max`` of what an adaptive trainer
        would run at each count (its best configuration), flat past the exploration cap:
        the curves a trainer reports to the allocator."""
        limit = self.node_limit(1, n_max)
        nodes = list(range(1, limit + 1))
        configs = self.best_configs(nodes)
        goodput = [
            (float(n), 0.0 if c is None else c.goodput_sps)
            for n, c in zip(nodes, configs, strict=True)
        ]
        thr = [
            (float(n), 0.0 if c is None else c.throughput_sps)
            for n, c in zip(nodes, configs, strict=True)
        ]
        if limit < n_max:
            goodput.append((float(n_max), goodput[-1][1] if goodput else 0.0))
            thr.append((float(n_max), thr[-1][1] if thr else 0.0))
        return tuple(goodput), tuple(thr)


def retune_choice(
    model: GoodputModel,
    nodes: int,
    replicas: int,
    local_bsz: int,
    accum_steps: int,
    *,
    best: GoodputConfig | None = None,
    switch_gain: float = DEFAULT_SWITCH_GAIN,
) -> GoodputConfig | None:
    """Pollux's re-tuning between rescales: the configuration to move to at the same
    size, or None to stay. The one rule of the live runtime (``PolluxAgent.retune``) and
    of the replay's simulated trainers (``replay/pollux/sim.py``).

    ``best`` is the model's best configuration at (``nodes``, ``replicas``) when the
    caller has it already. It is taken when its goodput exceeds the current
    configuration's by more than ``switch_gain`` (a fraction).
    """
    if best is None:
        best = model.best_configs([nodes], replicas=[replicas])[0]
        if best is None:
            return None
    now = float(model.goodput(nodes, local_bsz, accum_steps, replicas=replicas))
    if best.goodput_sps > now * (1 + switch_gain):
        return best
    return None


def _thin(points: list[tuple[int, float]], max_points: int) -> list[tuple[int, float]]:
    """Greedy refinement: start from the ends, add the worst-interpolated point each time."""
    xs = np.array([p[0] for p in points], dtype=float)
    ys = np.array([p[1] for p in points], dtype=float)
    keep = {0, len(points) - 1}
    while len(keep) < max_points:
        idx = sorted(keep)
        err = np.abs(ys - np.interp(xs, xs[idx], ys[idx]))
        err[idx] = -1.0
        worst = int(np.argmax(err))
        if err[worst] <= 0:
            break
        keep.add(worst)
    return [points[i] for i in sorted(keep)]
