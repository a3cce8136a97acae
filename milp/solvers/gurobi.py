"""Gurobi through gurobipy (optional extra), with native SOS2.

The pip package carries a size-limited licence (2,000 variables and 2,000 constraints,
SOS sets included); past it ``optimize()`` raises error 10010, which is turned into a
:class:`SolverLicenseError` that says what happened and which solver to use instead.
"""

from __future__ import annotations

import math
import time

import numpy as np

from bftrainer.milp.model import Milp
from bftrainer.milp.solvers.base import (
    DEFAULT_MIP_GAP,
    SolveOutcome,
    SolverError,
    SolverLicenseError,
    SolverUnavailableError,
    SolveStatus,
)

SIZE_LIMIT_EXCEEDED = 10010


class GurobiSolver:
    name = "gurobi"
    native_sos2 = True

    def solve(
        self,
        milp: Milp,
        *,
        time_limit_s: float,
        mip_gap: float = DEFAULT_MIP_GAP,
        integrality_tolerance: float | None = None,
    ) -> SolveOutcome:
        try:
            import gurobipy as gp
            from gurobipy import GRB
        except ImportError:
            raise SolverUnavailableError(
                "gurobipy is not installed: pip install 'bftrainer[gurobi]', or use --solver highs"
            ) from None
        start = time.perf_counter()
        try:
            env = gp.Env(empty=True)
            env.setParam("OutputFlag", 0)
            env.start()
            model = gp.Model(env=env)
            model.Params.TimeLimit = float(time_limit_s)
            model.Params.MIPGap = float(mip_gap)
            model.Params.MIPGapAbs = 0.0
            if integrality_tolerance is not None:
                model.Params.IntFeasTol = float(integrality_tolerance)
            model.Params.Threads = 1
            vtype = np.where(milp.integral, GRB.INTEGER, GRB.CONTINUOUS)
            x = model.addMVar(
                milp.num_vars,
                lb=np.where(np.isinf(milp.lb), -GRB.INFINITY, milp.lb),
                ub=np.where(np.isinf(milp.ub), GRB.INFINITY, milp.ub),
                vtype=vtype,
                obj=milp.c,
            )
            model.ModelSense = GRB.MAXIMIZE
            model.ObjCon = milp.offset
            eq = milp.row_lb == milp.row_ub
            ge = ~eq & np.isfinite(milp.row_lb)
            le = ~eq & np.isfinite(milp.row_ub)
            for mask, sense, rhs in (
                (eq, "=", milp.row_lb),
                (ge, ">", milp.row_lb),
                (le, "<", milp.row_ub),
            ):
                if mask.any():
                    model.addMConstr(milp.A[mask], x, sense, rhs[mask])
            if milp.start is not None:
                x.Start = milp.start  # the exact DP's answer: Gurobi has only the proof left
            xs = x.tolist()
            for members in milp.sos2:
                model.addSOS(
                    GRB.SOS_TYPE2, [xs[i] for i in members], list(range(1, len(members) + 1))
                )
            model.optimize()
        except gp.GurobiError as e:
            if e.errno == SIZE_LIMIT_EXCEEDED:
                raise SolverLicenseError(
                    "gurobipy's size-limited licence cannot hold this model "
                    f"({milp.num_vars} variables, {milp.num_rows} rows, {len(milp.sos2)} SOS sets;"
                    " the limit is 2,000 each): "
                    "use --solver highs (the default) or dp, or install a full Gurobi licence"
                ) from None
            raise SolverError(f"Gurobi failed: {e}") from None
        elapsed = time.perf_counter() - start
        status = model.Status
        has_solution = model.SolCount > 0
        values = np.array(x.X) if has_solution else None
        objective = float(model.ObjVal) if has_solution else None
        bound = float(model.ObjBound) if has_solution and math.isfinite(model.ObjBound) else None
        if status == GRB.OPTIMAL:
            return SolveOutcome(SolveStatus.OPTIMAL, values, objective, bound, elapsed)
        if status in (GRB.INFEASIBLE, GRB.INF_OR_UNBD):
            return SolveOutcome(SolveStatus.INFEASIBLE, None, None, None, elapsed)
        if status in (GRB.TIME_LIMIT, GRB.INTERRUPTED, GRB.SOLUTION_LIMIT, GRB.NODE_LIMIT):
            return SolveOutcome(SolveStatus.TIME_LIMIT, values, objective, bound, elapsed)
        raise SolverError(f"Gurobi ended with status {status}")
