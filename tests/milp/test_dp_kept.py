"""The pruned DP's step over kept counts (``dp._kept_slices`` for a few, ``dp._kept_block``
for many): the values and counts of the plain definition, ties included, and the pruned
DP's answer that of the full DP on alike trials (the slots path runs it every decision)."""

from __future__ import annotations

import numpy as np
import pytest

from bftrainer.milp import dp
from bftrainer.milp.greedy import best_grown
from tests.milp.test_dp_spans import identical_trials


def reference(
    best: np.ndarray, scores: np.ndarray, options: list[int], current: int, span: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """The step by its definition: at each capacity c of ``span``, the most of best[c - n]
    + scores[n] over kept n (-inf past c), the smallest n among equals, ``current`` first
    if kept; -inf below the span and the span's last values above it."""
    capacity = len(best) - 1
    first, last = span
    value = np.full(capacity + 1, -np.inf)
    pick = np.zeros(capacity + 1, dtype=np.int64)
    for c in range(first, last + 1):
        cells = [best[c - n] + scores[n] if n <= c else -np.inf for n in options]
        top = max(cells)
        chosen = options[cells.index(top)]
        if current in options and cells[options.index(current)] == top:
            chosen = current
        value[c], pick[c] = top, chosen
    value[last + 1 :], pick[last + 1 :] = value[last], pick[last]
    return value, pick


@pytest.mark.parametrize("block_cells", [dp.BLOCK_CELLS, 64])  # 64: many blocks
@pytest.mark.parametrize("kept", [1, 2, 5, dp.KEPT_SLICES, dp.KEPT_SLICES + 1, 20, 41])
@pytest.mark.parametrize("seed", range(6))
def test_a_step_over_kept_counts_is_its_definition(
    seed: int, kept: int, block_cells: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dp, "BLOCK_CELLS", block_cells)
    rng = np.random.default_rng(100 * kept + seed)
    capacity, n_max = int(rng.integers(45, 90)), 44
    # Small integers: many exact ties, between counts and with the current one.
    best = rng.integers(0, 6, capacity + 1).astype(float)
    best[: int(rng.integers(0, 4))] = -np.inf  # capacities below a span
    scores = rng.integers(0, 5, n_max + 1).astype(float)
    # Kept counts fit the capacity (``solve_counts_pruned`` keeps no other).
    options = sorted(rng.choice(n_max + 1, size=kept, replace=False).tolist())
    current = int(rng.choice(options)) if rng.random() < 0.7 else int(rng.integers(0, n_max + 1))
    first = int(rng.integers(0, capacity // 3))
    span = (first, int(rng.integers(first, capacity + 1)))
    got_value, got_pick = dp._step(
        best, scores, np.array(options, dtype=np.int64), current, None, span
    )
    want_value, want_pick = reference(best, scores, options, current, span)
    assert np.array_equal(got_value, want_value)
    assert np.array_equal(got_pick[span[0] :], want_pick[span[0] :])


@pytest.mark.parametrize("seed", range(12))
def test_the_pruned_dp_gives_the_full_dp_answer_on_alike_trials(seed: int) -> None:
    """Trials of one model holding a few nodes each: tables repeat, bounds are shared
    between alike trainers, most keep one count, some many."""
    trainers = 20 + 5 * seed
    nodes = 3 * trainers  # each holds up to 3
    terms = identical_trials(seed, trainers, nodes)
    for cap in (nodes // 4, nodes // 2, nodes):
        cap = min(cap, sum(t.n_max for t in terms))
        for t_fwd in (30.0, 120.0):
            full = dp.solve_counts(terms, cap, t_fwd)
            starts = [{t.id: 0 for t in terms}]  # feasible at any capacity
            if sum(t.c for t in terms) <= cap:
                starts.append({t.id: t.c for t in terms})
            start, _ = best_grown(terms, cap, t_fwd, starts)
            assert dp.solve_counts_pruned(terms, cap, t_fwd, start) == full
