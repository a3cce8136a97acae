"""Replay metrics, as in the BFTrainer paper §4.1.

- R (Eq. 17): the resource integral, idle nodes x time over the replay (node-seconds).
- N_eq (Eq. 18): R / elapsed, the equivalent number of dedicated nodes.
- A_e: samples processed by the trainers, net of rescale and preemption costs.
- A_s: the dedicated-nodes baseline, elapsed x P_best(N_eq), where P_best(N) is the best
  throughput of N whole nodes split among at most P_jmax trainers (0..n_max each) of
  the workload's curve, interpolated for fractional N. For a workload of several models
  the curve is their mean (exactly the paper's definition for a one-model set).
- U = A_e / A_s, over the whole replay and per window (6 h by default, Fig. 10).
- The limit U_max = A_max / A_s, with A_max the integral of P_best(N(t)) over the
  replay: what a zero-cost, clairvoyant policy would process, giving the best split of
  the pool at every instant and paying nothing to rescale or for preemptions. With
  concave curves the pool's fluctuation alone keeps U_max below 1 (P_best is concave).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bftrainer.loop import Step
from bftrainer.loop.jobs import JobSpec
from bftrainer.milp.dp import best_values
from bftrainer.milp.objective import TrainerTerms


@dataclass
class Window:
    start_s: float
    resource_node_s: float = 0.0
    processed_samples: float = 0.0
    cost_samples: float = 0.0


@dataclass
class MetricsRecorder:
    """Observer of the core loop: integrates R and samples, per window, incrementally."""

    start_s: float
    window_s: float = 6 * 3600.0
    resource_node_s: float = 0.0
    processed_samples: float = 0.0
    rescale_cost_samples: float = 0.0
    preemption_cost_samples: float = 0.0
    steps: list[Step] = field(default_factory=list)
    windows: dict[int, Window] = field(default_factory=dict)
    # Seconds spent at each pool size N(t): the limit's integral of P_best(N(t)).
    pool_size_s: dict[int, float] = field(default_factory=dict)
    # Node-seconds held by trainers: R less this is the pool's idle node-time. The
    # allocation changes only at recorded steps, so the last step's holds in between.
    allocated_node_s: float = 0.0
    _allocated_nodes: int = field(default=0, repr=False)

    def _window(self, t_s: float) -> Window:
        k = max(0, int((t_s - self.start_s) // self.window_s))
        if k not in self.windows:
            self.windows[k] = Window(self.start_s + k * self.window_s)
        return self.windows[k]

    def interval(self, t0_s: float, t1_s: float, pool_nodes: int, processed_samples: float) -> None:
        self.resource_node_s += pool_nodes * (t1_s - t0_s)
        self.allocated_node_s += self._allocated_nodes * (t1_s - t0_s)
        self.pool_size_s[pool_nodes] = self.pool_size_s.get(pool_nodes, 0.0) + (t1_s - t0_s)
        self.processed_samples += processed_samples
        rate = processed_samples / (t1_s - t0_s)
        t = t0_s
        while t < t1_s:  # split across window boundaries; rates are constant in between
            w = self._window(t)
            end = min(t1_s, w.start_s + self.window_s)
            w.resource_node_s += pool_nodes * (end - t)
            w.processed_samples += rate * (end - t)
            t = end

    def step(self, step: Step) -> None:
        self.steps.append(step)
        self._allocated_nodes = step.allocated_nodes
        self.rescale_cost_samples += step.rescale_cost_samples
        self.preemption_cost_samples += step.preemption_cost_samples
        cost = step.rescale_cost_samples + step.preemption_cost_samples
        if cost:
            self._window(step.time_s).cost_samples += cost


def reference_curve(jobs: Sequence[JobSpec]) -> np.ndarray:
    """The workload's mean throughput at 0..n_max nodes (each job capped at its n_max),
    weighting each distinct profile by how many jobs share it."""
    n_max = max(j.n_max for j in jobs)
    n = np.arange(n_max + 1)
    profiles = Counter((j.curve, j.n_max) for j in jobs)
    example = {(j.curve, j.n_max): j for j in jobs}
    mean = np.zeros(n_max + 1)
    for key, count in profiles.items():
        job = example[key]
        mean += count * np.interp(np.minimum(n, job.n_max), *job.breakpoints)
    return mean / len(jobs)


def best_split_sps(curve: np.ndarray, max_trainers: int, capacity: int) -> np.ndarray:
    """P_best(N) for N = 0..capacity: the best split of N whole nodes among at most
    ``max_trainers`` trainers of ``curve`` (the allocator's own knapsack, costs zero)."""
    n_max = len(curve) - 1
    term = TrainerTerms(
        id="ref",
        n_min=1,
        n_max=n_max,
        current=(),
        bp_nodes=np.arange(n_max + 1, dtype=float),
        bp_value=np.asarray(curve, float),
        rescale_up_s=0.0,
        rescale_down_s=0.0,
        runnable=True,
        current_value=0.0,
    )
    return best_values(term, max_trainers, capacity, 1.0)


def baseline_samples(elapsed_s: float, resource_node_s: float, best: np.ndarray) -> float:
    """A_s = elapsed x P_best(N_eq), N_eq interpolated between whole nodes."""
    if elapsed_s <= 0:
        return 0.0
    n_eq = resource_node_s / elapsed_s
    return elapsed_s * float(np.interp(n_eq, np.arange(len(best)), best))


def limit_samples(pool_size_s: dict[int, float], best: np.ndarray) -> float:
    """A_max: the integral of P_best(N(t)) dt, from the seconds spent at each pool size
    (``best`` must cover the largest). Whole nodes: no interpolation."""
    return float(sum(best[n] * seconds for n, seconds in sorted(pool_size_s.items())))


def utilization(achieved: float, baseline: float) -> float:
    return achieved / baseline if baseline > 0 else math.nan
