"""The DP in bounded memory (issue 31): computed by blocks of capacities and, past
``CHOICE_CELLS``, traced back by blocks of trainers, it gives the same answer as with
every choice kept, counts and ties included."""

from __future__ import annotations

import numpy as np
import pytest

from bftrainer.milp import Problem, TrainerSpec, dp
from bftrainer.milp.objective import TrainerTerms, build_terms


def random_terms(seed: int, trainers: int, nodes: int) -> list[TrainerTerms]:
    rng = np.random.default_rng(seed)
    specs = []
    for j in range(trainers):
        n_max = int(rng.integers(1, nodes + 5))
        xs = np.unique(np.concatenate(([1], rng.integers(1, n_max + 1, 3), [n_max])))
        ys = np.cumsum(rng.uniform(1, 100, len(xs)))
        specs.append(
            TrainerSpec(
                f"t{j}",
                int(rng.integers(1, max(2, n_max // 2))),
                n_max,
                float(rng.uniform(0, 30)),
                float(rng.uniform(0, 30)),
                tuple((float(x), float(y)) for x, y in zip(xs, ys, strict=True)),
            )
        )
    pool = tuple(f"n{i}" for i in range(nodes))
    held = iter(pool)
    specs = [
        TrainerSpec(s.id, s.n_min, s.n_max, s.rescale_up_s, s.rescale_down_s, s.curve,
                    nodes=tuple(next(held) for _ in range(int(rng.integers(0, 3)))))
        for s in specs
    ]  # fmt: skip
    return build_terms(Problem(pool=pool, trainers=tuple(specs), max_trainers=trainers))


@pytest.mark.parametrize("seed", range(12))
def test_blocked_dp_gives_the_answer_of_the_full_tables(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    terms = random_terms(seed, trainers=7 + seed, nodes=40 + 3 * seed)
    cap = 40 + 3 * seed
    full = dp.solve_counts(terms, cap, 120.0)
    incumbent = {t.id: 0 for t in terms}
    pruned = dp.solve_counts_pruned(terms, cap, 120.0, incumbent)
    monkeypatch.setattr(dp, "BLOCK_CELLS", 7)  # a few capacities per block
    monkeypatch.setattr(dp, "CHOICE_CELLS", 3 * (cap + 1))  # ~3 trainers' choices kept
    assert dp.solve_counts(terms, cap, 120.0) == full
    assert dp.solve_counts_pruned(terms, cap, 120.0, incumbent) == pruned
    assert pruned[1] == pytest.approx(full[1], rel=1e-12)
