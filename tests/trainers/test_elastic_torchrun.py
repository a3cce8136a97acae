"""torchrun backend, real processes: grow and shrink, worker loss, zero hosts, stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainers.elastic_harness import Trainer, launched, scenario_rescale

__all__ = ["launched"]


@pytest.mark.slow
def test_rescale_1_3_2_1(launched: list[Trainer], tmp_path: Path) -> None:
    scenario_rescale(launched, tmp_path, "torchrun")
