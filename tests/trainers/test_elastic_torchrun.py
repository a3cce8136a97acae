"""torchrun backend, real processes: grow and shrink, worker loss, zero hosts, stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainers.elastic_harness import (
    Trainer,
    launched,
    scenario_rescale,
    scenario_worker_killed,
    scenario_zero_hosts_and_restart,
)

__all__ = ["launched"]


@pytest.mark.slow
def test_rescale_1_3_2_1(launched: list[Trainer], tmp_path: Path) -> None:
    scenario_rescale(launched, tmp_path, "torchrun")


@pytest.mark.slow
def test_worker_killed_costs_at_most_the_steps_since_the_last_commit(
    launched: list[Trainer], tmp_path: Path
) -> None:
    scenario_worker_killed(launched, tmp_path, "torchrun")


@pytest.mark.slow
def test_zero_hosts_and_stop_resume_from_the_checkpoint(
    launched: list[Trainer], tmp_path: Path
) -> None:
    scenario_zero_hosts_and_restart(launched, tmp_path, "torchrun")
