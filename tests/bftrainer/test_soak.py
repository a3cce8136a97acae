"""The randomized soak (tests/bftrainer/soak.py), one fixed seed, briefly, on the real
local Slurm: every invariant a centre relies on, under submits, cancels, main jobs,
holders cancelled by hand, a daemon killed or down, and supervisors killed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bftrainer.daemon_service import Service
from tests.bftrainer.soak import KINDS, Soak, replay_command, schedule
from tests.conftest import SlurmCluster
from tests.trainers.elastic_harness import horovod_missing

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SEED = 1
DURATION_S = 150.0
DOWN_S = 45.0


def test_schedules_are_reproducible_and_cover_every_fault() -> None:
    a = schedule(SEED, DURATION_S, 8, DOWN_S)
    assert a == schedule(SEED, DURATION_S, 8, DOWN_S)
    assert a != schedule(SEED + 1, DURATION_S, 8, DOWN_S)
    kinds = {x.kind for s in range(1, 4) for x in schedule(s, 1200.0, 8, 120.0)}
    assert kinds == set(KINDS)


def test_soak_one_seed(slurm: SlurmCluster, tmp_path: Path) -> None:
    if (why := horovod_missing()) is not None:
        pytest.skip(why)
    logs = tmp_path / "logs"
    logs.mkdir()
    service = Service(slurm, tmp_path / "state", logs)
    soak = Soak(service, SEED, schedule(SEED, DURATION_S, len(slurm.nodes), DOWN_S))
    try:
        report = soak.run(poll_s=2.0, lease_s=60.0, drain_s=240.0)
    finally:
        service.cleanup()
    print(report.summary(), report.by_kind)
    assert not report.violations, (
        "\n".join(report.violations)
        + f"\nreplay: {replay_command(SEED, DURATION_S, DOWN_S)}\n"
        + "".join(service.logs())[-6000:]
    )
