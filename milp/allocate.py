"""``allocate``: the one function the rest of bftrainer calls to decide an allocation."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bftrainer.milp.check import violations
from bftrainer.milp.count import build_count_model
from bftrainer.milp.dp import solve_counts
from bftrainer.milp.mapping import map_counts
from bftrainer.milp.node import build_node_model
from bftrainer.milp.objective import TrainerTerms, admitted, build_terms, objective_of_counts
from bftrainer.milp.problem import Problem
from bftrainer.milp.solvers import DEFAULT_MIP_GAP, MILP_SOLVERS, SolveStatus

log = logging.getLogger(__name__)

FORMULATIONS = ("count", "node")
SOLVERS = ("highs", "cbc", "gurobi", "dp")
DEFAULT_TIME_LIMIT_S = 10.0


class AllocatorConfigError(ValueError):
    """An impossible choice of formulation and solver."""


class AllocationBugError(RuntimeError):
    """A solver answer broke a constraint: never applied, always reported."""


@dataclass(frozen=True)
class Allocation:
    """The decision: node sets per trainer (waiting trainers get none).

    ``status``: ``optimal``; ``time_limit`` (the solver's incumbent, better than the
    current map); ``kept_current`` (time limit with no better incumbent: the current map
    is kept, paper §3.6). ``objective`` is Eq. 16 of the returned allocation; ``bound`` the
    best proven upper bound when the solver gives one.
    """

    nodes: Mapping[str, tuple[str, ...]]
    objective: float
    status: str
    bound: float | None
    solve_s: float
    solver: str
    formulation: str
    waiting: tuple[str, ...] = ()
    counts: Mapping[str, int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", {k: len(v) for k, v in self.nodes.items()})

    def to_json(self) -> dict[str, Any]:
        return {
            "allocation": {k: list(v) for k, v in self.nodes.items()},
            "objective": self.objective,
            "status": self.status,
            "bound": self.bound,
            "solve_s": self.solve_s,
            "solver": self.solver,
            "formulation": self.formulation,
            "waiting": list(self.waiting),
        }


def current_counts(terms: list[TrainerTerms]) -> dict[str, int]:
    """The current map made feasible: a trainer below n_min after departures stops."""
    return {t.id: t.c if t.runnable and t.c >= t.n_min else 0 for t in terms}


def allocate(
    problem: Problem,
    *,
    formulation: str = "count",
    solver: str = "highs",
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    mip_gap: float = DEFAULT_MIP_GAP,
) -> Allocation:
    """Solve the BFTrainer model for ``problem`` and map the answer to nodes."""
    if formulation not in FORMULATIONS:
        raise AllocatorConfigError(
            f"formulation {formulation!r} is not one of {', '.join(FORMULATIONS)}"
        )
    if solver not in SOLVERS:
        raise AllocatorConfigError(f"solver {solver!r} is not one of {', '.join(SOLVERS)}")
    if solver == "dp" and formulation != "count":
        raise AllocatorConfigError("the dp solver solves the count formulation only")
    start = time.perf_counter()
    terms = build_terms(problem)
    waiting = tuple(t.id for t in admitted(problem)[1])
    t_fwd = float(problem.t_fwd_s)
    current = current_counts(terms)
    current_nodes = {t.id: t.current for t in terms}
    status, bound = "optimal", None
    if not terms:  # nothing to decide; solvers reject empty models
        nodes: dict[str, tuple[str, ...]] = {}
        bound = 0.0
    elif solver == "dp":
        counts, bound = solve_counts(terms, len(problem.pool), t_fwd)
        nodes = map_counts(current_nodes, counts, problem.pool)
    else:
        backend = MILP_SOLVERS[solver]()
        if formulation == "count":
            encoding = "sos2" if backend.native_sos2 else "per_count"
            cm = build_count_model(terms, len(problem.pool), t_fwd, encoding)
            outcome = backend.solve(cm.milp, time_limit_s=time_limit_s, mip_gap=mip_gap)
            decoded = cm.counts(outcome.x, terms) if outcome.x is not None else None
            nodes = map_counts(current_nodes, decoded, problem.pool) if decoded is not None else {}
        else:
            nm = build_node_model(terms, problem.pool, t_fwd)
            outcome = backend.solve(nm.milp, time_limit_s=time_limit_s, mip_gap=mip_gap)
            nodes = nm.node_sets(outcome.x, terms) if outcome.x is not None else {}
        bound = outcome.bound
        if outcome.status is SolveStatus.INFEASIBLE:
            # Cannot happen (0 nodes for all is feasible); treat as a solver fault.
            raise AllocationBugError(f"{solver} reported the {formulation} model infeasible")
        if outcome.status is SolveStatus.TIME_LIMIT:
            keep_current = outcome.x is None or objective_of_counts(
                terms, {k: len(v) for k, v in nodes.items()}, t_fwd
            ) <= objective_of_counts(terms, current, t_fwd)
            status = "kept_current" if keep_current else "time_limit"
            if keep_current:
                nodes = map_counts(current_nodes, current, problem.pool)
            log.warning(
                "%s hit its %.1f s limit on the %s model: %s",
                solver,
                time_limit_s,
                formulation,
                "keeping the current map" if keep_current else "using its incumbent",
            )
    all_nodes = {t.id: nodes.get(t.id, ()) for t in problem.trainers}
    broken = violations(problem, all_nodes)
    if broken:
        raise AllocationBugError(f"{solver}/{formulation} answer breaks constraints: {broken[:3]}")
    objective = objective_of_counts(terms, {k: len(v) for k, v in all_nodes.items()}, t_fwd)
    return Allocation(
        nodes=all_nodes,
        objective=objective,
        status=status,
        bound=bound,
        solve_s=time.perf_counter() - start,
        solver=solver,
        formulation=formulation,
        waiting=waiting,
    )
