"""The replay's simulated driver reads a trainer's rate off its job's curve directly
when nothing can change it (one slot per node, no subclass rate): the same progress,
completions and wake-ups, to the bit, as through ``_rate`` (issue 39)."""

from __future__ import annotations

import random

import pytest

from bftrainer.loop import TrainerState
from bftrainer.loop.jobs import JobSpec
from bftrainer.replay.simulator import SimulatedDriver


class ThroughRate(SimulatedDriver):
    """The long path: a subclass's own ``_rate`` (the same one) turns the shortcut off."""

    def _rate(self, trainer: TrainerState, holding: tuple[str, ...]) -> float:
        return super()._rate(trainer, holding)


def trainers(rng: random.Random) -> list[TrainerState]:
    out = []
    for i in range(rng.randint(1, 12)):
        curve = ((1.0, rng.uniform(1, 50)), (8.0, rng.uniform(50, 300)), (64.0, 900.0))
        job = JobSpec(f"j{i}", "m", 0.0, 1, 64, 18.0, 12.0, rng.uniform(1e3, 1e6), curve)
        nodes = tuple(f"n{i}-{k}" for k in range(rng.choice([0, 1, 3, 8, 64])))
        out.append(TrainerState(job, nodes=nodes, processed_samples=rng.uniform(0, 1e3)))
    return out


@pytest.mark.parametrize("seed", range(10))
def test_rates_off_the_curve_are_the_rates_through_rate(seed: int) -> None:
    rng = random.Random(seed)
    fast, slow = SimulatedDriver(), ThroughRate()
    assert fast._plain() and not slow._plain() and not SimulatedDriver(2)._plain()
    a, b = trainers(random.Random(seed)), trainers(random.Random(seed))
    now = 1.6e9
    for _ in range(40):
        pa, pb = fast.advance(a, now), slow.advance(b, now)
        assert pa == pb
        assert [t.processed_samples for t in a] == [t.processed_samples for t in b]
        wa, wb = fast.next_wakeup_s(a, now), slow.next_wakeup_s(b, now)
        assert wa == wb
        now = min(wa, now + rng.choice([0.0, 1.0, 90.0, 3600.0]))
