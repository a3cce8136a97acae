"""A search trial's promise, one rule for the replay and the live campaign (issue 40).

A trial's mark is the rungs of successive halving it has passed: Optuna's pruner records
``completed_rung_K`` on a trial it judged at rung K (system attributes), DeepHyper's
stopper ``_completed_rung_K`` on its job (metadata), and a trial still running after a
judgement was promoted there. milp weighs a trial's term of the objective by
``search_promise ** rungs`` (``TrainerSpec.weight``; 1, the default, is the paper's
model): the replay (``[replay] search_promise``, bftrainer/replay/search.py) and the
daemon (``[daemon] search_promise``, reading the mark the campaign stores with the
trainer) apply the same rule, here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

RUNG_KEY = "completed_rung_"  # Optuna's "completed_rung_K", DeepHyper's "_completed_rung_K"
PROMISE_RANGE = (1.0, 100.0)  # search_promise: 1 is off (every weight 1)


def rungs_passed(keys: Iterable[str]) -> int:
    """The rungs a trial has reached, from its pruner's keys (Optuna's system attributes,
    DeepHyper's job metadata); for a trial that runs on, the rungs it passed."""
    return sum(1 for key in keys if RUNG_KEY in key)


def promise_weight(promise: float, rungs: int) -> float:
    """milp's weight on a trial's term of the objective: ``promise ** rungs``."""
    return float(promise**rungs)


def promise_error(value: object) -> str | None:
    """Why ``value`` is no ``search_promise`` (a number from 1 to 100), or None."""
    lo, hi = PROMISE_RANGE
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or math.isnan(value)
        or not lo <= value <= hi
    ):
        return f"search_promise = {value!r}: expected a number from {lo:g} to {hi:g}"
    return None
