"""Holder jobs: preemptible scheduler jobs that keep bftrainer's nodes (see base.py)."""

from bftrainer.holders.base import (
    HolderError,
    Holders,
    HolderStatus,
    HolderStatusError,
    HolderSubmitError,
    ReconcileResult,
    WindowTooShortError,
    window_minutes,
)
from bftrainer.holders.lsf import LsfHolders, lsf_step_argv
from bftrainer.holders.slurm import SlurmHolders, slurm_step_argv

__all__ = [
    "HolderError",
    "HolderStatus",
    "HolderStatusError",
    "HolderSubmitError",
    "Holders",
    "LsfHolders",
    "ReconcileResult",
    "SlurmHolders",
    "WindowTooShortError",
    "lsf_step_argv",
    "slurm_step_argv",
    "window_minutes",
]
