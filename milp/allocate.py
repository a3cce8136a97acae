"""``allocate``: the one function the rest of bftrainer calls to decide an allocation."""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bftrainer.milp.bound import lp_rounded_counts
from bftrainer.milp.check import violations
from bftrainer.milp.count import build_count_model
from bftrainer.milp.dp import DeadlineError, dp_cells, solve_counts, solve_counts_pruned
from bftrainer.milp.greedy import best_grown, grow_greedily
from bftrainer.milp.mapping import map_counts
from bftrainer.milp.node import build_node_model, build_slot_model
from bftrainer.milp.objective import (
    TrainerTerms,
    admitted,
    build_terms,
    objective_of_counts,
    objective_of_holdings,
)
from bftrainer.milp.problem import Problem
from bftrainer.milp.slot_packing import map_slots
from bftrainer.milp.solvers import DEFAULT_MIP_GAP, MILP_SOLVERS, SolveStatus
from bftrainer.milp.solvers.stdout_guard import solver_stdout_to_log
from bftrainer.milp.windows import allocate_windows, has_windows

log = logging.getLogger(__name__)

FORMULATIONS = ("count", "node")
SOLVERS = ("highs", "cbc", "gurobi", "dp")
DEFAULT_TIME_LIMIT_S = 10.0
# The DP's check costs about 2.5 ns per (capacity, count) pair here (dp_cells): it runs
# when it fits in this share of the time limit, else an unchecked "optimal" is reported
# as ``unverified``. At the default 10 s: 2e9 pairs, e.g. 10,000 trainers on 3,000 nodes.
DP_CELLS_PER_S = 4e8
DP_SHARE_OF_LIMIT = 0.5
# Building the node model (milp/node.py) costs about 1.2 us per (trainer, pool node)
# pair here (10,000 x 1,000 in 12.3 s); it is not started when it cannot end in time.
NODE_BUILD_S_PER_CELL = 1.5e-6
# The slot model (S > 1), which no DP checks, is solved with integer columns within 1e-9
# of an integer, not the solvers' 1e-6: at 1e-6 HiGHS called it optimal 7e-6 below the
# exact optimum, a segment binary at 1 - 1e-6 mixing two placements (its bound was
# under the optimum too). At S = 4 on benchmark instances (5 x 20, 10 x 50) the optima
# were the same and the medians 4.2 -> 3.7 s and 1.31 -> 1.32 s.
SLOT_INTEGRALITY_TOLERANCE = 1e-9
# Building the per-count model costs about 0.9 us per (trainer, count) column here (20
# trainers of n_max 1e6: 2e7 columns in 18.5 s on a loaded machine); not started when
# it cannot end in time (issue 42: --time-limit 5 took 46 s).
COUNT_BUILD_S_PER_CELL = 1e-6
# What follows the solver costs up to ~5 us per node given out at 1e6 nodes (the greedy
# growth, the mapping, the independent constraint check).
RESERVE_S_PER_NODE = 2e-6


class AllocatorConfigError(ValueError):
    """An impossible choice of formulation and solver."""


class AllocationBugError(RuntimeError):
    """A solver answer broke a constraint: never applied, always reported."""


@dataclass(frozen=True)
class Allocation:
    """The decision: node sets per trainer (waiting trainers get none); with slots, a
    node once per slot held there.

    ``status`` (docs/allocator.md, "Status"): ``optimal`` (the allocation is optimal:
    the solver's proof agreed with the exact dynamic program, or the DP's answer was
    used); ``time_limit`` (the solver stopped at the limit; the best of its incumbent,
    the DP's answer when it applies, and the current map); ``kept_current`` (time
    limit, nothing better than the current map, paper §3.6); ``unverified`` (the solver
    says optimal, but the problem is too large for the DP's check); ``windows`` (nodes
    leave within the horizon: the window model's answer, milp/windows.py; not proven
    optimal, and ``objective`` is its value V); ``bounded`` (slots: the count model's
    answer could not be packed as its bound assumed; ``objective`` <= the optimum <=
    ``bound``, docs/allocator.md, "Slots"). ``objective`` is
    Eq. 16 of the returned allocation; ``bound`` the best proven upper bound, if known.
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


# The modules each solver imports on its first call (none at import of bftrainer.milp,
# which must stay light): a fresh process's first solve spent 0.3-0.4 s importing them,
# and reported it as solve_s (issue 42).
_SOLVER_MODULES = {
    "highs": ("scipy.sparse", "highspy"),
    "cbc": ("scipy.sparse", "pulp"),
    "gurobi": ("scipy.sparse", "gurobipy"),
    "dp": (),
}


def load_solver(solver: str) -> None:
    """Import what ``solver`` needs, once per process (a missing package is the
    solver's to report, with its own message, when it runs)."""
    global _LOADED
    if solver in _LOADED:
        return
    for name in _SOLVER_MODULES.get(solver, ()):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if "scipy.sparse" in _SOLVER_MODULES.get(solver, ()):
        # scipy's first sparse matrix reads numpy's integer limits (8 ms, once).
        import scipy.sparse as sp

        sp.csr_matrix((np.ones(1), (np.zeros(1, int), np.zeros(1, int))), shape=(1, 1))
    _LOADED = _LOADED | {solver}


_LOADED: frozenset[str] = frozenset()


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
    """Solve the BFTrainer model for ``problem`` and map the answer to nodes.

    ``time_limit_s`` covers the whole call (model building included). A MILP answer is
    checked against the exact dynamic program whenever that fits in half the time
    limit: it is the same optimum (docs/allocator.md), and a solver can
    call a badly scaled model "optimal" when it is not.
    """
    if formulation not in FORMULATIONS:
        raise AllocatorConfigError(
            f"formulation {formulation!r} is not one of {', '.join(FORMULATIONS)}"
        )
    if solver not in SOLVERS:
        raise AllocatorConfigError(f"solver {solver!r} is not one of {', '.join(SOLVERS)}")
    if solver == "dp" and formulation != "count":
        raise AllocatorConfigError("the dp solver solves the count formulation only")
    if not (math.isfinite(time_limit_s) and time_limit_s > 0):
        raise AllocatorConfigError(f"time_limit_s is {time_limit_s!r}, expected seconds > 0")
    load_solver(solver)  # before the clock: solve_s and the time limit time the solve
    start = time.perf_counter()
    deadline = start + time_limit_s
    terms = build_terms(problem)
    waiting = tuple(t.id for t in admitted(problem)[1])
    t_fwd = float(problem.t_fwd_s)
    status, bound = "optimal", None
    slots = problem.slots_per_node > 1
    if not terms:  # nothing to decide; solvers reject empty models
        nodes: dict[str, tuple[str, ...]] = {}
        bound = 0.0
    elif solver == "dp":
        nodes, status, bound = _solve_dp(problem, terms, deadline, time_limit_s)
    elif slots and formulation == "node":
        nodes, status, bound = _solve_slot_milp(problem, terms, solver, deadline, mip_gap)
    else:
        nodes, status, bound = _solve_milp(
            problem, terms, formulation, solver, deadline, time_limit_s, mip_gap
        )
    if slots and terms:
        nodes, status = _pack_or_bound(problem, terms, nodes, status, bound, deadline)
    window_value = None
    if terms and has_windows(problem):
        # Nodes leave within the horizon: refine by the window model (milp/windows.py),
        # from the current map and the window-free optimum; Eq. 16's optimum bounds it.
        free_counts = {t.id: len(nodes.get(t.id, ())) for t in terms}
        # (Eq. 16's optimum bounds V at one slot a node: a map worth it is the answer.)
        top = bound if status == "optimal" and not slots else None
        nodes, window_value = allocate_windows(
            problem, terms, [current_counts(terms), free_counts], top
        )
        status = "windows" if status == "optimal" else status
    all_nodes = {t.id: nodes.get(t.id, ()) for t in problem.trainers}
    broken = violations(problem, all_nodes)
    if broken:
        raise AllocationBugError(f"{solver}/{formulation} answer breaks constraints: {broken[:3]}")
    if window_value is not None:
        objective = window_value
    elif slots:
        objective = objective_of_holdings(terms, all_nodes, t_fwd)
    else:
        objective = objective_of_counts(terms, {k: len(v) for k, v in all_nodes.items()}, t_fwd)
    if bound is not None and bound < objective:
        # The optimum is at least the answer's exact value. A solver's bound below it is
        # the bound of its model's rounding of Eq. 16 (seen: 4e-5 relative, the slot
        # model fair by user at p = -1), not news.
        bound = objective
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


def _solve_milp(
    problem: Problem,
    terms: list[TrainerTerms],
    formulation: str,
    solver: str,
    deadline: float,
    time_limit_s: float,
    mip_gap: float,
) -> tuple[dict[str, tuple[str, ...]], str, float | None]:
    """The MILP's answer checked against the exact DP: (nodes, status, bound)."""
    t_fwd = float(problem.t_fwd_s)
    current_nodes = {t.id: t.current for t in terms}
    current = current_counts(terms)
    cap = capacity(problem)
    place = mapper(problem)
    # The exact answer first (milliseconds at the paper's sizes): the check of the
    # solver's "optimal", and the fallback when the solver stops at its limit.
    exact: tuple[dict[str, int], float] | None = None
    dp_s = DP_SHARE_OF_LIMIT * time_limit_s
    if dp_cells(terms, cap) <= DP_CELLS_PER_S * dp_s:
        try:
            exact = exact_counts(problem, terms, time.perf_counter() + dp_s)
        except DeadlineError as e:
            log.info("no exact check: %s", e)
    backend = MILP_SOLVERS[solver]()
    outcome = None
    answer: dict[str, tuple[str, ...]] | None = None
    if formulation == "node":
        build_s = NODE_BUILD_S_PER_CELL * len(terms) * cap
    elif exact is None and not backend.native_sos2:  # per-count columns, 0..n_max each
        build_s = COUNT_BUILD_S_PER_CELL * sum(min(t.n_max, cap) + 1 for t in terms)
    else:
        build_s = 0.0  # pruned by the DP's answer, or SOS2 on the curve's breakpoints
    reserve_s = _reserve_s(terms, time_limit_s, cap)
    if time.perf_counter() + build_s + reserve_s > deadline:
        # Building it has no clock to look at: 10,000 trainers x 1,000 nodes took 12 s
        # against a 10 s limit (node); 20 trainers of n_max 1e6 on 1e6 nodes, 18 s
        # against 5 s (count). The exact DP's (or the greedy) answer stands instead.
        log.info(
            "%s/%s not run: building the model would take ~%.3g s", solver, formulation, build_s
        )
    elif time.perf_counter() < deadline:
        if formulation == "count":
            # With the DP's answer the pruned per-count model is small for any solver (and
            # fits gurobipy's size-limited licence); without it, native SOS2 is compact.
            # With slots the per-count tables are not the curve's breakpoints: per_count.
            encoding = (
                "per_count"
                if exact is not None or not backend.native_sos2 or problem.slots_per_node > 1
                else "sos2"
            )
            # The DP's answer prunes the model by the LP bound and starts the solver.
            incumbent = exact[0] if exact is not None else None
            cm = build_count_model(terms, cap, t_fwd, encoding, incumbent)
        else:
            nm = build_node_model(terms, problem.pool, t_fwd)
        # Keep time for what follows the solver (the greedy fallback, mapping, checks:
        # about 0.1 ms per trainer), so the whole call ends near the limit.
        remaining_s = deadline - time.perf_counter() - reserve_s
        if remaining_s > 0:
            milp = cm.milp if formulation == "count" else nm.milp
            with solver_stdout_to_log():  # stdout is the commands' output (--json)
                outcome = backend.solve(milp, time_limit_s=remaining_s, mip_gap=mip_gap)
            if outcome.x is not None and outcome.status is not SolveStatus.INFEASIBLE:
                if formulation == "count":
                    answer = place(current_nodes, cm.counts(outcome.x, terms))
                else:
                    answer = nm.node_sets(outcome.x, terms)
    left_s = deadline - reserve_s - time.perf_counter()
    if exact is None and answer is None and dp_cells(terms, cap) <= DP_CELLS_PER_S * left_s:
        # The solver gave nothing (not run, or no incumbent): the time left to the DP,
        # if it can end in it (its steps do not look at the clock: 20 trainers of n_max
        # 1e6 on 1e6 nodes spent 3 s in one).
        try:
            exact = exact_counts(problem, terms, deadline - reserve_s)
        except DeadlineError as e:
            log.info("no exact answer either: %s", e)
    if outcome is not None and outcome.status is SolveStatus.INFEASIBLE and exact is None:
        # Cannot happen (0 nodes for all is feasible): a numerical fault of the solver.
        raise AllocationBugError(f"{solver} reported the {formulation} model infeasible")
    timed_out = outcome is None or outcome.status is not SolveStatus.OPTIMAL
    if answer is not None and violations(problem, answer):
        log.error("%s/%s answer breaks constraints; not used", solver, formulation)
        answer = None
    value = (
        objective_of_counts(terms, {k: len(v) for k, v in answer.items()}, t_fwd)
        if answer is not None
        else -math.inf
    )
    if exact is not None:
        counts, best = exact
        chosen = {k: len(v) for k, v in (answer or {}).items()}
        if value < best - _tolerance(terms, t_fwd, counts, chosen):
            if outcome is not None and outcome.status is not SolveStatus.TIME_LIMIT:
                log.warning(
                    "%s called the %s model %s with objective %.9g, but the exact optimum is "
                    "%.9g (a badly scaled objective?): using the exact answer",
                    solver,
                    formulation,
                    outcome.status,
                    value,
                    best,
                )
            answer = place(current_nodes, counts)
        if outcome is None or outcome.status is SolveStatus.TIME_LIMIT:
            log.warning(
                "%s stopped at the %.3g s limit on the %s model: using the exact DP's answer",
                solver,
                time_limit_s,
                formulation,
            )
            return answer or {}, "time_limit", best
        return answer or {}, "optimal", best
    if not timed_out:
        assert outcome is not None
        return answer or {}, "unverified", outcome.bound
    # No exact answer: the better of the incumbent and the current map grown greedily.
    grown = grow_greedily(terms, cap, t_fwd, current)
    grown_value = objective_of_counts(terms, grown, t_fwd)
    used = "using its incumbent"
    if answer is None or grown_value > value:
        answer, value, used = place(current_nodes, grown), grown_value, ""
    keep_current = value <= objective_of_counts(terms, current, t_fwd)
    log.warning(
        "%s hit its %.3g s limit on the %s model: %s",
        solver,
        time_limit_s,
        formulation,
        "keeping the current map"
        if keep_current
        else used or "using the current map grown greedily with free nodes",
    )
    if keep_current:
        answer = place(current_nodes, current)
    bound = outcome.bound if outcome is not None else None
    return answer or {}, "kept_current" if keep_current else "time_limit", bound


def _solve_dp(
    problem: Problem, terms: list[TrainerTerms], deadline: float, time_limit_s: float
) -> tuple[dict[str, tuple[str, ...]], str, float | None]:
    """The DP's exact answer within the time limit; past it, the current map grown
    greedily with free nodes (status ``time_limit``), as when a MILP solver stops."""
    try:
        counts, bound = exact_counts(
            problem, terms, deadline - _reserve_s(terms, time_limit_s, capacity(problem))
        )
        status = "optimal"
    except DeadlineError as e:
        counts = grow_greedily(
            terms, capacity(problem), float(problem.t_fwd_s), current_counts(terms)
        )
        bound, status = None, "time_limit"
        log.warning("dp: %s: using the current map grown greedily with free nodes", e)
    return mapper(problem)({t.id: t.current for t in terms}, counts), status, bound


def _reserve_s(terms: list[TrainerTerms], time_limit_s: float, cap: int = 0) -> float:
    """Time kept for what follows a solver (the greedy fallback, mapping, checks: about
    0.1 ms per trainer, and RESERVE_S_PER_NODE per node given out)."""
    given = min(cap, sum(t.n_max for t in terms))
    return min(1e-4 * len(terms) + RESERVE_S_PER_NODE * given, 0.5 * time_limit_s)


def exact_counts(
    problem: Problem, terms: list[TrainerTerms], deadline: float | None
) -> tuple[dict[str, int], float]:
    """The count model's optimum by the DP: all counts at S = 1 (as ever); with slots,
    only those that can beat the greedy answer (exact too, and the capacity is S x
    larger there)."""
    t_fwd = float(problem.t_fwd_s)
    if problem.slots_per_node == 1:
        return solve_counts(terms, capacity(problem), t_fwd, deadline)
    cap = capacity(problem)
    tables = [t.scores(t_fwd) for t in terms]
    starts = [current_counts(terms), lp_start(terms, cap, tables)]
    start, _ = best_grown(terms, cap, t_fwd, starts, tables)
    return solve_counts_pruned(terms, cap, t_fwd, start, deadline, tables)


def lp_start(terms: list[TrainerTerms], cap: int, tables: list[np.ndarray]) -> dict[str, int]:
    """The LP optimum's counts rounded down (``lp_rounded_counts``): a start for the
    greedy that is close to the optimum where the current map is not (some trainers
    must shrink for others to grow)."""
    counts = lp_rounded_counts(tables, cap)
    return {t.id: int(n) for t, n in zip(terms, counts, strict=True)}


def capacity(problem: Problem) -> int:
    """What the counts share: pool nodes, or their slots with S > 1."""
    return len(problem.pool) * problem.slots_per_node


def mapper(
    problem: Problem,
) -> Callable[[Mapping[str, tuple[str, ...]], Mapping[str, int]], dict[str, tuple[str, ...]]]:
    """Counts to holdings without migration: node sets (S = 1: as ever), or slots."""
    if problem.slots_per_node == 1:
        return lambda current, counts: map_counts(current, counts, problem.pool)
    return lambda current, counts: map_slots(current, counts, problem.pool, problem.slots_per_node)


def _pack_or_bound(
    problem: Problem,
    terms: list[TrainerTerms],
    nodes: dict[str, tuple[str, ...]],
    status: str,
    bound: float | None,
    deadline: float,
) -> tuple[dict[str, tuple[str, ...]], str]:
    """Slots: value the holdings at their real placement. The count model valued each
    trainer at the best placement its holding allows, an upper bound; when the mapping
    could not pack as assumed, the best of that and the counts that are best at the
    worst placement (which any mapping reaches) is returned, status ``bounded``.

    Those counts come from the pruned DP against the placed answer's value: only an
    answer worth more at the worst placement could replace it, so only its counts are
    searched (the full DP took about 100 ms at 30 trainers x 800 nodes x 6 slots)."""
    t_fwd = float(problem.t_fwd_s)
    value = objective_of_holdings(terms, nodes, t_fwd)
    if bound is None or value >= bound - _tolerance(terms, t_fwd, {}):
        return nodes, status
    if time.perf_counter() < deadline:
        try:
            low = [t.low_scores(t_fwd) for t in terms]
            cap = capacity(problem)
            placed = {t.id: len(nodes.get(t.id, ())) for t in terms}
            starts = [placed, current_counts(terms), lp_start(terms, cap, low)]
            start, _ = best_grown(terms, cap, t_fwd, starts, low)
            counts, _ = solve_counts_pruned(terms, cap, t_fwd, start, deadline, low)
            other = mapper(problem)({t.id: t.current for t in terms}, counts)
            if (
                not violations(problem, other)
                and objective_of_holdings(terms, other, t_fwd) > value
            ):
                nodes = other
        except DeadlineError as e:
            log.info("no worst-placement answer: %s", e)
    return nodes, "bounded" if status == "optimal" else status


def _solve_slot_milp(
    problem: Problem, terms: list[TrainerTerms], solver: str, deadline: float, mip_gap: float
) -> tuple[dict[str, tuple[str, ...]], str, float | None]:
    """The slot-level MILP (milp/node.py, exact): (holdings, status, bound); on a time
    out or no answer, the count model's answer by the DP, mapped."""
    t_fwd = float(problem.t_fwd_s)
    answer, status, bound = None, "time_limit", None
    # Three (trainer, node) blocks of columns where the node model has one.
    build_s = 3 * NODE_BUILD_S_PER_CELL * len(terms) * len(problem.pool)
    if time.perf_counter() + build_s > deadline:
        log.info("%s/node not run: building the slot model would take ~%.3g s", solver, build_s)
        remaining_s = 0.0
    else:
        model = build_slot_model(terms, problem.pool, problem.slots_per_node, t_fwd)
        remaining_s = deadline - time.perf_counter()
    if remaining_s > 0:
        with solver_stdout_to_log():
            outcome = MILP_SOLVERS[solver]().solve(
                model.milp,
                time_limit_s=remaining_s,
                mip_gap=mip_gap,
                integrality_tolerance=SLOT_INTEGRALITY_TOLERANCE,
            )
        bound = outcome.bound
        if outcome.x is not None and outcome.status is not SolveStatus.INFEASIBLE:
            answer = model.holdings(outcome.x, terms)
            if violations(problem, answer):
                log.error("%s/node answer breaks constraints; not used", solver)
                answer = None
            elif outcome.status is SolveStatus.OPTIMAL:
                status = "optimal"
    if answer is None:
        counts, upper = solve_counts(terms, capacity(problem), t_fwd)
        answer = mapper(problem)({t.id: t.current for t in terms}, counts)
        bound = upper if bound is None else bound
    return answer, status, bound


def _tolerance(terms: list[TrainerTerms], t_fwd_s: float, *answers: Mapping[str, int]) -> float:
    """How far two sums of Eq. 16 terms may differ by rounding alone: relative to the
    terms the compared answers add up (the unused ones, however large, do not count)."""
    scale = max(sum(abs(float(t.scores(t_fwd_s)[a.get(t.id, 0)])) for t in terms) for a in answers)
    return 1e-9 * max(1.0, scale)
