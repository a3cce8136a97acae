"""Allocation models and solvers: decides, knows nothing of Slurm or Horovod."""

from bftrainer.milp.allocate import (
    DEFAULT_TIME_LIMIT_S,
    FORMULATIONS,
    SOLVERS,
    Allocation,
    AllocationBugError,
    AllocatorConfigError,
    allocate,
)
from bftrainer.milp.problem import (
    Problem,
    ProblemError,
    TrainerSpec,
    check_speedup,
    problem_from_dict,
)

__all__ = [
    "DEFAULT_TIME_LIMIT_S",
    "FORMULATIONS",
    "SOLVERS",
    "Allocation",
    "AllocationBugError",
    "AllocatorConfigError",
    "Problem",
    "ProblemError",
    "TrainerSpec",
    "allocate",
    "check_speedup",
    "problem_from_dict",
]
