"""The DP computes only the capacities its trace back can read (``dp._spans``, issue 39:
a year's replay at 100 trainers): it must give the answer of the DP over every
capacity, counts and ties included (ties are the rule among identical HPO trials)."""

from __future__ import annotations

import numpy as np
import pytest

from bftrainer.milp import Problem, TrainerSpec, dp
from bftrainer.milp.objective import TrainerTerms, build_terms


def identical_trials(seed: int, trainers: int, nodes: int, n_min: int = 1) -> list[TrainerTerms]:
    """Trials of one model (integer values: many exact ties), holding a few nodes each."""
    rng = np.random.default_rng(seed)
    n_max = int(rng.integers(2, 20))
    xs = np.arange(1, n_max + 1)
    curve = tuple(
        (float(x), float(y)) for x, y in zip(xs, np.cumsum(rng.integers(0, 4, n_max)), strict=True)
    )
    pool = tuple(f"n{i}" for i in range(nodes))
    held = iter(pool)
    specs = []
    for j in range(trainers):
        count = min(int(rng.integers(0, 4)), n_max)
        nodes_held = tuple(next(held) for _ in range(count))
        lowest = min(n_min, n_max)
        specs.append(TrainerSpec(f"t{j}", lowest, n_max, 18.0, 12.0, curve, nodes=nodes_held))
    return build_terms(Problem(pool=pool, trainers=tuple(specs), max_trainers=trainers))


def every_capacity(terms: list[TrainerTerms], cap: int, t_fwd_s: float) -> dict[str, int]:
    """The trace back over the full tables of ``knapsack`` (every capacity computed)."""
    _, choices = dp.knapsack(terms, cap, t_fwd_s)
    counts, c = {}, cap
    for j in range(len(terms) - 1, -1, -1):
        counts[terms[j].id] = int(choices[j, c])
        c -= counts[terms[j].id]
    return {t.id: counts[t.id] for t in terms}


@pytest.mark.parametrize("seed", range(16))
def test_the_dp_over_the_capacities_it_reads_gives_the_full_dp_answer(seed: int) -> None:
    trainers, nodes = 3 + seed, 10 + 5 * seed
    terms = identical_trials(seed, trainers, nodes)
    for cap in (0, 1, nodes // 3, nodes // 2, nodes):
        cap = min(cap, sum(t.n_max for t in terms))
        for t_fwd in (1.0, 30.0, 120.0):
            counts, value = dp.solve_counts(terms, cap, t_fwd)
            assert counts == every_capacity(terms, cap, t_fwd)
            best, _ = dp.knapsack(terms, cap, t_fwd)
            assert value == float(best[cap])


@pytest.mark.parametrize("seed", range(24))
def test_a_pool_that_holds_every_n_max_gives_the_full_dp_answer(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dp._solve_unbound`` (the capacity is every n_max summed) against the full
    tables and against the DP it skips: counts, ties and value to the bit."""
    terms = identical_trials(seed, 2 + seed % 9, 400, n_min=1 + seed % 3)
    cap = sum(t.n_max for t in terms)
    for t_fwd in (1.0, 30.0, 120.0, 3600.0):
        counts, value = dp.solve_counts(terms, 400, t_fwd)
        assert counts == every_capacity(terms, cap, t_fwd)
        best, _ = dp.knapsack(terms, cap, t_fwd)
        assert value == float(best[cap])
        with monkeypatch.context() as m:
            m.setattr(dp, "_solve_unbound", lambda terms, tables: None)
            skipped, skipped_value = dp.solve_counts(terms, 400, t_fwd)
        assert counts == skipped
        assert np.float64(value).tobytes() == np.float64(skipped_value).tobytes()
