"""The runs of one ``bftrainer replay`` command: one configuration per policy named,
or per T_fwd of a sweep, and the name each run's folder and table column carry.

The command parses its flags; this module turns them into the runs' configurations
and refuses, with a :class:`~bftrainer.replay.run.ReplayError` naming the flag, a list
that cannot run (a policy unknown or named twice, the scavenger on Pollux's trainers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from bftrainer.replay.run import POLICIES, ReplayConfig, ReplayError, ReplayResult


def run_label(run: ReplayResult | ReplayConfig) -> str:
    """A run's name: its folder under --out, its column of the table."""
    c = run.config if isinstance(run, ReplayResult) else run
    tfwd = c.t_fwd_s if isinstance(c.t_fwd_s, str) else f"{c.t_fwd_s:g}"
    return f"milp-tfwd{tfwd}" if c.policy == "milp" else c.policy


def sweep_configs(base: ReplayConfig, t_fwd_values: list[float | str]) -> list[ReplayConfig]:
    """The milp policy once per T_fwd (seconds or "auto")."""
    return [replace(base, policy="milp", t_fwd_s=v) for v in t_fwd_values]


def policy_configs(base: ReplayConfig, policies: str | None, pollux: bool) -> list[ReplayConfig]:
    """One run per policy of the comma list ``policies`` (None: ``base``'s policy);
    ``pollux``: the runs drive Pollux's trainers."""
    names = [p.strip() for p in (policies or base.policy).split(",") if p.strip()]
    if not names:
        raise ReplayError(f"--policy {policies!r}: name one of {', '.join(POLICIES)}")
    for p in names:
        if p not in POLICIES:
            raise ReplayError(f"--policy {p!r} is not one of {', '.join(POLICIES)}")
        if names.count(p) > 1:
            raise ReplayError(f"--policy {p!r} is named twice (its runs share one folder)")
    configs = [replace(base, policy=p) for p in names]
    if pollux and "scavenger" in names:
        raise ReplayError(
            "--policy scavenger replays rigid jobs from their throughput curves; it "
            "cannot run Pollux's trainers (--workload pollux)"
        )
    return configs


# Settings one policy alone reads: each means nothing unless one of the runs is its
# (the scavenger's rigid jobs; the allocator's model and solver).
POLICY_ONLY: dict[str, tuple[str, ...]] = {
    "scavenger": ("scavenger_size", "checkpoint_every_s", "restart_s"),
    "milp": (
        "objective",
        "formulation",
        "solver",
        "t_fwd_s",
        "time_limit_s",
        "fairness_p",
        "fair_share_speedup",
    ),
}


def unused_by_policies(
    configs: Sequence[ReplayConfig], given: Mapping[str, str]
) -> tuple[str, str] | None:
    """Where a setting that one policy alone reads was given (a flag, a file's key), and
    that policy, when no run is that policy's; else None: it would be ignored without a
    word."""
    for policy, names in POLICY_ONLY.items():
        if any(c.policy == policy for c in configs):
            continue
        where = next((given[f] for f in names if f in given), None)
        if where is not None:
            return where, policy
    return None
