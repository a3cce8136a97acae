"""MILP solver backends behind one interface (``base.MilpSolver``)."""

from __future__ import annotations

from bftrainer.milp.solvers.base import (
    DEFAULT_MIP_GAP,
    MilpSolver,
    SolveOutcome,
    SolverError,
    SolverLicenseError,
    SolverUnavailableError,
    SolveStatus,
)
from bftrainer.milp.solvers.cbc import CbcSolver
from bftrainer.milp.solvers.gurobi import GurobiSolver
from bftrainer.milp.solvers.highs import HighsSolver

MILP_SOLVERS: dict[str, type[MilpSolver]] = {
    "highs": HighsSolver,
    "cbc": CbcSolver,
    "gurobi": GurobiSolver,
}

__all__ = [
    "DEFAULT_MIP_GAP",
    "MILP_SOLVERS",
    "MilpSolver",
    "SolveOutcome",
    "SolveStatus",
    "SolverError",
    "SolverLicenseError",
    "SolverUnavailableError",
]
