"""The exact DP's deadline: it gives up early when its pace cannot make it, but a slow
first trainer (a fresh process's warm-up) does not make it give up (milp/dp.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pytest

from bftrainer.milp import Problem, TrainerSpec
from bftrainer.milp.dp import DeadlineError, knapsack
from bftrainer.milp.objective import TrainerTerms, build_terms


def terms(trainers: int, nodes: int) -> list[TrainerTerms]:
    specs = tuple(
        TrainerSpec(
            f"t{j}", 1, 16, 18.0, 12.0, ((1.0, 100.0 + j % 7), (4.0, 350.0), (16.0, 1200.0))
        )
        for j in range(trainers)
    )
    return build_terms(
        Problem(pool=tuple(f"n{i}" for i in range(nodes)), trainers=specs, max_trainers=trainers)
    )


@dataclass
class Slow:
    """A trainer whose table takes ``delay_s`` to read: what a cold process costs."""

    inner: TrainerTerms
    delay_s: float

    def scores(self, t_fwd_s: float) -> np.ndarray:
        time.sleep(self.delay_s)
        return self.inner.scores(t_fwd_s)

    @property
    def c(self) -> int:
        return self.inner.c


def test_a_slow_first_trainer_does_not_make_the_dp_give_up() -> None:
    ts = terms(300, 200)
    expected, _ = knapsack(ts, 200, 120.0)
    slow_first = cast(list[Any], [Slow(ts[0], 0.05), *ts[1:]])
    # Judged by the first trainer, 300 trainers would take 15 s; they take milliseconds.
    best, _ = knapsack(slow_first, 200, 120.0, deadline=time.perf_counter() + 2.0)
    assert np.array_equal(best, expected)


def test_a_dp_that_cannot_make_it_gives_up_early() -> None:
    ts = cast(list[Any], [Slow(t, 0.002) for t in terms(1_000, 200)])  # 2 s of work at least
    started = time.perf_counter()
    with pytest.raises(DeadlineError, match="would pass its deadline"):
        knapsack(ts, 200, 120.0, deadline=started + 1.0)
    assert time.perf_counter() - started < 0.5  # judged on its pace, not at the deadline
