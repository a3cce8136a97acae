"""Searches on harvested nodes: an Optuna study's trials as bftrainer trainers.

``Campaign`` (campaign.py) runs the study on a daemon's pool, trial by trial as the pool
allows, prunes losing trials through the study's pruner and tells the study each end;
``space.py`` turns ``--param`` specs into distributions and a trial's parameters into the
script's options. ``bftrainer hpo`` (bftrainer/cli/hpo.py) is the shell's way in;
docs/hpo.md the lifecycle. Importing this package imports Optuna (the ``hpo`` extra);
``bftrainer.hpo.evaluator`` (DeepHyper's ``Evaluator`` on trainers) is imported apart, as
it imports DeepHyper.
"""

from bftrainer.hpo.campaign import (
    ATTR_END,
    ATTR_PRUNED,
    ATTR_TRAINER,
    OPEN_ERRORS,
    TRIAL_OPTION,
    Campaign,
    CampaignError,
    Tally,
    TrialSpec,
    checked_name,
    first_line,
    room,
    study_lock,
    summary,
    token,
    trainers_by_trial,
)
from bftrainer.hpo.space import SpaceError, as_args, parse_param, parse_space

__all__ = [
    "ATTR_END",
    "ATTR_PRUNED",
    "ATTR_TRAINER",
    "OPEN_ERRORS",
    "TRIAL_OPTION",
    "Campaign",
    "CampaignError",
    "SpaceError",
    "Tally",
    "TrialSpec",
    "as_args",
    "checked_name",
    "first_line",
    "parse_param",
    "parse_space",
    "room",
    "study_lock",
    "summary",
    "token",
    "trainers_by_trial",
]
