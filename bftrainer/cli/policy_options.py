"""The allocation-policy flags shared by ``bftrainer replay`` and ``bftrainer daemon``.

Each flag overrides one field of :class:`bftrainer.policies.config.Config` (after a ``--config``
file): one definition here, so the two commands take the same flags with the same checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from bftrainer.cli.params import Number
from bftrainer.milp import FORMULATIONS, SOLVERS
from bftrainer.milp.problem import FAIR_BY, FAIRNESS_P_RANGE, OBJECTIVES, T_FWD_MAX_S
from bftrainer.policies.config import MAX_TRAINERS, Config

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT = Config()


class TFwd(Number):
    """T_fwd: ``auto`` (from the pool's churn, bftrainer/loop/churn.py) or seconds."""

    def describe(self) -> str:
        return f"auto or {super().describe()}"

    def parse(self, value: Any) -> int | float | str | None:  # type: ignore[override]
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        return super().parse(value)


# T_fwd as the allocator accepts it (docs/allocator.md, "Limits"), or auto. Here, not in
# bftrainer.cli.params, which `bftrainer status` imports: its limit is the allocator's.
T_FWD = TFwd(min=0.0, min_open=True, max=T_FWD_MAX_S)

# Config field -> the flag that sets it (for error messages).
FLAG_NAMES = {
    "t_fwd_s": "--tfwd",
    "objective": "--objective",
    "formulation": "--formulation",
    "solver": "--solver",
    "time_limit_s": "--time-limit",
    "fairness_p": "--fairness-p",
    "fair_share_speedup": "--fair-share-speedup",
    "fair_by": "--fair-by",
    "max_trainers": "--max-parallel",
    "redecide_every_s": "--redecide-every",
}


def policy_options(func: F) -> F:
    """Add the policy flags; each arrives as a keyword named after its Config field."""
    options = [
        click.option(
            "--tfwd",
            "t_fwd_s",
            type=T_FWD,
            help="T_fwd of the milp policy: seconds, or auto (from the pool's churn; the default).",
        ),
        click.option(
            "--objective",
            type=click.Choice(list(OBJECTIVES)),
            help=f"Default {DEFAULT.objective}.",
        ),
        click.option(
            "--formulation",
            type=click.Choice(FORMULATIONS),
            help=f"Default {DEFAULT.formulation}.",
        ),
        click.option("--solver", type=click.Choice(SOLVERS), help=f"Default {DEFAULT.solver}."),
        click.option(
            "--time-limit",
            "time_limit_s",
            type=Number(min=0.01),
            help=f"Solver limit per decision, s (default {DEFAULT.time_limit_s:g}).",
        ),
        click.option(
            "--fairness-p",
            type=Number(min=FAIRNESS_P_RANGE[0], max=FAIRNESS_P_RANGE[1]),
            help="Pollux's fairness knob for the milp objective (1: plain sum; -1: Pollux's; "
            f"default {DEFAULT.fairness_p:g}).",
        ),
        click.option(
            "--fair-share-speedup/--no-fair-share-speedup",
            default=None,
            help="Value each trainer as speedup over its fair share of the pool (default off).",
        ),
        click.option(
            "--fair-by",
            type=click.Choice(FAIR_BY),
            help="Whose shares the fairness (--fairness-p, --fair-share-speedup) evens out "
            f"(default {DEFAULT.fair_by}; weights: fair_weights in the config file).",
        ),
        click.option(
            "--max-parallel",
            "max_trainers",
            type=Number(integer=True, min=1, max=MAX_TRAINERS),
            help=f"P_jmax: trainers at once (default {DEFAULT.max_trainers}).",
        ),
        click.option(
            "--redecide-every",
            "redecide_every_s",
            type=Number(min=0.0),
            help="A reported curve re-decides at most this often, s "
            f"(default {DEFAULT.redecide_every_s:g}).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def policy_flags(options: dict[str, Any]) -> dict[str, Any]:
    """Take the policy flags out of a command's keyword arguments (Config field -> value)."""
    return {name: options.pop(name) for name in FLAG_NAMES}
