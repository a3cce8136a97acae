"""An exhaustive oracle written from the paper's Eq. 16, independent of the package's
objective tables: enumerate every node-to-trainer map of a tiny problem."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from bftrainer.milp import Problem, TrainerSpec
from bftrainer.milp.check import violations

FLOOR = 0.05  # the speedup floor of the fairness transform, as documented


def admitted(problem: Problem) -> list[TrainerSpec]:
    """Who takes part: the first max_trainers by trainer; by user or account, rounds in
    which every group with trainers left admits its next one (earliest first)."""
    if problem.fair_by == "trainer":
        return list(problem.trainers[: problem.max_trainers])
    queues: dict[str, list[TrainerSpec]] = {}
    for t in problem.trainers:
        queues.setdefault(owner(problem, t), []).append(t)
    chosen: list[TrainerSpec] = []
    while len(chosen) < problem.max_trainers and any(queues.values()):
        heads = sorted(
            (q[0] for q in queues.values() if q), key=lambda t: problem.trainers.index(t)
        )
        for t in heads[: problem.max_trainers - len(chosen)]:
            chosen.append(t)
            queues[owner(problem, t)].pop(0)
    return sorted(chosen, key=lambda t: problem.trainers.index(t))


def owner(problem: Problem, t: TrainerSpec) -> str:
    return {"trainer": t.id, "user": t.user, "account": t.account}[problem.fair_by]


def f_p(p: float, v: float) -> float:
    if p == 1:
        return v
    if p == 0:
        return math.log((v + FLOOR) / FLOOR)
    return ((v + FLOOR) ** p - FLOOR**p) / p


def metric(problem: Problem, t: TrainerSpec, n: int) -> float:
    """O_j(n): the metric, then speedup over the fair share, then Pollux's power mean
    (by user or account: the group's, valuing each trainer as if all its group's
    trainers did as well; docs/allocator.md, "Fair by user or account")."""
    v = t.value_at(float(n))
    if problem.objective == "speedup":
        one = t.value_at(1.0)
        v = v / one if one > 0 else 0.0
    taking_part = admitted(problem)
    mine = owner(problem, t)
    k = sum(1 for o in taking_part if owner(problem, o) == mine)
    groups = {owner(problem, o) for o in taking_part}
    by_trainer = problem.fair_by == "trainer"
    w = 1.0 if by_trainer else problem.fair_weights.get(mine, 1.0)
    total_w = sum(1.0 if by_trainer else problem.fair_weights.get(g, 1.0) for g in groups)
    if problem.fair_share_speedup:
        share = min(max(len(problem.pool) * w / total_w / k, t.n_min), t.n_max)
        ref = metric_at(problem, t, share)
        v = v / ref if ref > 0 else v
        return w / k * f_p(problem.fairness_p, v)
    if problem.fairness_p == 1:
        return v
    return w / k * f_p(problem.fairness_p, k * v / w)


def metric_at(problem: Problem, t: TrainerSpec, n: float) -> float:
    v = t.value_at(n)
    if problem.objective == "speedup":
        one = t.value_at(1.0)
        return v / one if one > 0 else 0.0
    return v


def eq16(problem: Problem, counts: dict[str, int]) -> float:
    """T_fwd * sum_j O_j(N_j) - sum_j O_j(C_j) R_j over the admitted trainers."""
    total = 0.0
    for t in admitted(problem):
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
    taking_part = [t.id for t in admitted(problem)]
    # A count outside n_min..n_max is one of the violations: skipping such a map before
    # ``violations`` judges it changes no answer, and most maps of a small pool are such.
    limits = {t.id: (t.n_min, t.n_max) for t in problem.trainers}
    count_ok = problem.slots_per_node == 1
    best = float("-inf")
    for owners in itertools.product([None, *taking_part], repeat=len(problem.pool)):
        if count_ok and any(
            (n := owners.count(t)) > 0 and not limits[t][0] <= n <= limits[t][1]
            for t in taking_part
        ):
            continue
        nodes: dict[str, list[str]] = {t: [] for t in taking_part}
        for node, owner in zip(problem.pool, owners, strict=True):
            if owner is not None:
                nodes[owner].append(node)
        as_tuples = {k: tuple(v) for k, v in nodes.items()}
        if violations(problem, as_tuples):
            continue
        best = max(best, value(problem, as_tuples))
    return best
