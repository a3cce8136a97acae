"""The one interface every MILP solver backend implements."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np

from bftrainer.milp.model import Milp

# Default MIP gaps (1e-4) are looser than the rescale-cost terms of Eq. 16.
DEFAULT_MIP_GAP = 1e-7


class SolveStatus(StrEnum):
    OPTIMAL = "optimal"
    TIME_LIMIT = "time_limit"  # stopped at the limit; ``x`` is the incumbent, if any
    INFEASIBLE = "infeasible"


@dataclass(frozen=True)
class SolveOutcome:
    status: SolveStatus
    x: np.ndarray | None  # None: no incumbent
    objective: float | None
    bound: float | None  # best proven upper bound, when the solver reports one
    solve_s: float


class SolverError(RuntimeError):
    """A solver failed in a way the allocator cannot recover from by itself."""


class SolverUnavailableError(SolverError):
    """The solver's package is not installed."""


class SolverLicenseError(SolverError):
    """The solver's licence does not allow this model."""


class MilpSolver(Protocol):
    name: str
    native_sos2: bool  # honours SOS2 sets itself; otherwise models pick binary encodings

    def solve(
        self,
        milp: Milp,
        *,
        time_limit_s: float,
        mip_gap: float = DEFAULT_MIP_GAP,
        integrality_tolerance: float | None = None,
    ) -> SolveOutcome:
        """Maximise ``milp``; never raise on a time limit, return the incumbent instead.
        ``integrality_tolerance``: how far an integer column may lie from an integer
        (None: the solver's default, 1e-6 for all three)."""
        ...
