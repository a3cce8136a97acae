"""CBC through PuLP's bundled binary.

PuLP silently drops SOS2 on its default MPS path, and CBC's LP-file path that honours it
has crashed on the node model, so SOS2 sets become binary segments here too. After a time
limit PuLP's ``LpStatus`` still says "Optimal": ``sol_status`` tells the truth.
"""

from __future__ import annotations

import math
import time
import warnings

import numpy as np

from bftrainer.milp.model import Milp, sos2_as_segments
from bftrainer.milp.solvers.base import DEFAULT_MIP_GAP, SolveOutcome, SolverError, SolveStatus

_CHECK_EVERY = 1024  # variables or rows between looks at the clock while building


class CbcSolver:
    name = "cbc"
    native_sos2 = False

    def solve(
        self,
        milp: Milp,
        *,
        time_limit_s: float,
        mip_gap: float = DEFAULT_MIP_GAP,
        integrality_tolerance: float | None = None,
    ) -> SolveOutcome:
        import pulp

        start = time.perf_counter()
        deadline = start + time_limit_s

        def out_of_time() -> SolveOutcome:
            # PuLP builds in Python, about 5 us per variable or term: at 10,000 trainers
            # the build alone can pass the limit.
            return SolveOutcome(
                SolveStatus.TIME_LIMIT, None, None, None, time.perf_counter() - start
            )

        m = sos2_as_segments(milp)
        prob = pulp.LpProblem("bftrainer", pulp.LpMaximize)
        xs = []
        for i, (lo, hi, integral) in enumerate(zip(m.lb, m.ub, m.integral, strict=True)):
            if i % _CHECK_EVERY == 0 and time.perf_counter() > deadline:
                return out_of_time()
            xs.append(
                prob.add_variable(
                    f"x{i}",
                    lowBound=None if math.isinf(lo) else lo,
                    upBound=None if math.isinf(hi) else hi,
                    cat=pulp.LpInteger if integral else pulp.LpContinuous,
                )
            )
        nz = np.flatnonzero(m.c)
        prob += pulp.LpAffineExpression([(xs[i], float(m.c[i])) for i in nz]) + m.offset
        A = m.A
        for r in range(m.num_rows):
            if r % _CHECK_EVERY == 0 and time.perf_counter() > deadline:
                return out_of_time()
            lo, hi = A.indptr[r], A.indptr[r + 1]
            expr = pulp.LpAffineExpression(
                [(xs[i], float(v)) for i, v in zip(A.indices[lo:hi], A.data[lo:hi], strict=True)]
            )
            rlb, rub = float(m.row_lb[r]), float(m.row_ub[r])
            if rlb == rub:
                prob += expr == rlb
                continue
            if not math.isinf(rlb):
                prob += expr >= rlb
            if not math.isinf(rub):
                prob += expr <= rub
        # PuLP 3 marks PULP_CBC_CMD deprecated for 4.0, which drops the bundled binary
        # (hence pulp<4 in pyproject.toml); it is the only CBC that needs no install.
        remaining_s = deadline - time.perf_counter()
        if remaining_s <= 0:
            return out_of_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            solver = pulp.PULP_CBC_CMD(
                msg=False,
                timeLimit=max(remaining_s, 0.1),
                gapRel=mip_gap,
                gapAbs=0.0,
                options=(
                    [f"integerTolerance {integrality_tolerance:g}"]
                    if integrality_tolerance is not None
                    else []
                ),
                # No ``threads``: any -threads value enters CBC 2.10's threaded code, which
                # hung here until the time limit on a 5-variable model, once in ~400
                # solves (coin-or/Cbc#640). CBC's default is serial.
            )
        prob.solve(solver)
        elapsed = time.perf_counter() - start
        sol = prob.sol_status
        if sol == pulp.LpSolutionInfeasible:
            return SolveOutcome(SolveStatus.INFEASIBLE, None, None, None, elapsed)
        if sol in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            x = np.array([v.varValue or 0.0 for v in xs])[: milp.num_vars]
            objective = float(pulp.value(prob.objective) or 0.0)
            status = (
                SolveStatus.OPTIMAL if sol == pulp.LpSolutionOptimal else SolveStatus.TIME_LIMIT
            )
            return SolveOutcome(
                status, x, objective, objective if status is SolveStatus.OPTIMAL else None, elapsed
            )
        if sol == pulp.LpSolutionNoSolutionFound:
            return SolveOutcome(SolveStatus.TIME_LIMIT, None, None, None, elapsed)
        raise SolverError(f"CBC ended with solution status {pulp.LpSolution.get(sol, sol)}")
