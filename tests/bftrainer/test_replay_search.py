"""bftrainer replay --search: an Optuna search's trials as the replay's trainers, pruned
early by Optuna's own pruner, with time to target in summary.json."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
from bftrainer.replay.run import ReplayConfig, replay
from bftrainer.replay.search import CurveFamily
from bftrainer.replay.workload import hpo_workload

FIELDS = ("time_to_target_s", "trials_run", "trials_pruned", "trials_completed")


def search(policy: str, pruner: str, trials: int = 30, promise: float = 1.0) -> dict[str, Any]:
    trace = synthetic_trace(SyntheticConfig(nodes=64, duration_s=24 * 3600, seed=1))
    (job,) = hpo_workload(1, trace.start_s)
    # Short trials (30 min on 2 nodes): the trace's ~7 idle nodes run them all in hours.
    jobs = [replace(job, work_samples=job.rate_sps(2) * 1800.0)]
    extra = {"scavenger_size": 4} if policy == "scavenger" else {}
    config = ReplayConfig(
        policy=policy,
        solver="dp",
        search="tpe",
        search_pruner=pruner,
        search_trials=trials,
        search_promise=promise,
        **extra,
    )
    return replay(trace, jobs, config).summary


def test_the_target_is_the_families_first_percentile() -> None:
    family = CurveFamily(seed=3, work=1e6)
    rng = np.random.default_rng(99)
    finals = [
        family.loss(10 ** rng.uniform(-4, 0), rng.uniform(0, 1), rng.normal(0, 0.01), 1e6)
        for _ in range(4000)
    ]
    share = float(np.mean(np.array(finals) <= family.target()))
    assert 0.005 <= share <= 0.02, share
    # A curve falls as it trains, towards its final value.
    values = [family.loss(0.01, 0.5, 0.0, s) for s in (0, 1e4, 1e5, 1e6)]
    assert values == sorted(values, reverse=True)


def test_pruning_ends_losers_and_saves_node_hours() -> None:
    pruned, full = search("milp", "asha"), search("milp", "none")
    for s in (pruned, full):
        assert s["trials_run"] == 30
        # Every trial run ended one way or the other, or still ran at the trace's end.
        assert s["trials_pruned"] + s["trials_completed"] <= s["trials_run"]
    assert pruned["trials_pruned"] >= 10 and full["trials_pruned"] == 0
    assert full["trials_completed"] == 30
    assert pruned["node_hours_per_trial"] < full["node_hours_per_trial"]
    assert pruned["target_loss"] == full["target_loss"]  # one target for every run
    assert pruned["curves_prior"] is None  # known curves: no prior stands anywhere


def test_a_search_replay_is_seeded() -> None:
    a, b = search("milp", "asha", 12), search("milp", "asha", 12)
    assert {k: a[k] for k in FIELDS} == {k: b[k] for k in FIELDS}
    assert a["best_loss"] == b["best_loss"]


def test_promise_reaches_milp_and_one_is_the_plain_model() -> None:
    """search_promise w: milp weighs a trial that passed k rungs by w**k. The same seed
    with and without it: other allocations (the weights reach the policy), the same
    target; the summary says which ran."""
    plain, promised = search("milp", "asha", 12), search("milp", "asha", 12, promise=4.0)
    assert plain["search_promise"] == 1.0 and promised["search_promise"] == 4.0
    assert plain["target_loss"] == promised["target_loss"]
    assert plain["node_hours_per_trial"] != promised["node_hours_per_trial"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--search", "tpe", "--curves", "learned"], "--search runs with known curves"),
        (["--search", "grid"], "'grid' is not one of"),
        (["--search", "tpe", "--trials", "0"], "is not an integer >= 1"),
    ],
)
def test_bad_search_flags_are_one_line(tmp_path: Any, flags: list[str], message: str) -> None:
    args = ["replay", "--synthetic-hours", "2", "--synthetic-nodes", "16", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, [*args, *flags])
    assert result.exit_code != 0
    assert message in result.output, result.output
