"""An exhaustive oracle written from the paper's Eq. 16, independent of the package's
objective tables: enumerate every node-to-trainer map of a tiny problem."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from bftrainer.milp import Problem, TrainerSpec
from bftrainer.milp.check import violations

FLOOR = 0.05  # the speedup floor of the fairness transform, as documented


def metric(problem: Problem, t: TrainerSpec, n: int) -> float:
    """O_j(n): the metric, then speedup over the fair share, then Pollux's power mean."""
    v = t.value_at(float(n))
    if problem.objective == "speedup":
        one = t.value_at(1.0)
        v = v / one if one > 0 else 0.0
    if problem.fair_share_speedup:
        admitted = len(problem.trainers[: problem.max_trainers])
        share = min(max(len(problem.pool) / max(admitted, 1), t.n_min), t.n_max)
        ref = metric_at(problem, t, share)
        v = v / ref if ref > 0 else v
    p = problem.fairness_p
    if p == 1:
        return v
    if p == 0:
        return math.log((v + FLOOR) / FLOOR)
    return ((v + FLOOR) ** p - FLOOR**p) / p


def metric_at(problem: Problem, t: TrainerSpec, n: float) -> float:
    v = t.value_at(n)
    if problem.objective == "speedup":
        one = t.value_at(1.0)
        return v / one if one > 0 else 0.0
    return v


def eq16(problem: Problem, counts: dict[str, int]) -> float:
    """T_fwd * sum_j O_j(N_j) - sum_j O_j(C_j) R_j over the admitted trainers."""
    total = 0.0
    for t in problem.trainers[: problem.max_trainers]:
        n, c = counts.get(t.id, 0), len(problem.current_nodes(t))
        r = t.rescale_up_s if n > c else t.rescale_down_s if n < c else 0.0
        total += problem.t_fwd_s * metric(problem, t, n) - metric(problem, t, c) * r
    return total


def eq16_of_map(problem: Problem, nodes: dict[str, tuple[str, ...]]) -> float:
    return eq16(problem, {k: len(v) for k, v in nodes.items()})


def brute_force(
    problem: Problem,
    value: Callable[[Problem, dict[str, tuple[str, ...]]], float] = eq16_of_map,
) -> float:
    """The best ``value`` (Eq. 16 by default) over every feasible node map (waiting
    trainers get none)."""
    admitted = [t.id for t in problem.trainers[: problem.max_trainers]]
    best = float("-inf")
    for owners in itertools.product([None, *admitted], repeat=len(problem.pool)):
        nodes: dict[str, list[str]] = {t: [] for t in admitted}
        for node, owner in zip(problem.pool, owners, strict=True):
            if owner is not None:
                nodes[owner].append(node)
        as_tuples = {k: tuple(v) for k, v in nodes.items()}
        if violations(problem, as_tuples):
            continue
        best = max(best, value(problem, as_tuples))
    return best
