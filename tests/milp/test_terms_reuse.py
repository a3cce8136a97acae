"""``build_terms`` reuses the terms of a spec it has seen (issue 39: a replay hands the
same spec to consecutive decisions): over any run of problems sharing spec objects,
each term and its score tables are those built afresh, to the last bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bftrainer.milp.objective as objective
from bftrainer.milp import Problem, TrainerSpec, allocate
from bftrainer.milp.objective import TrainerTerms, build_terms

NODES = tuple(f"n{i:02d}" for i in range(10))
SPECS = (
    TrainerSpec("a", 1, 4, 18.0, 12.0, ((1.0, 10.0), (2.0, 19.0), (4.0, 30.0)), user="u1"),
    TrainerSpec("b", 2, 6, 5.0, 3.0, ((1.0, 4.0), (6.0, 20.0)), user="u2", weight=2.5),
    TrainerSpec("c", 1, 3, 18.0, 12.0, ((1.0, 10.0), (3.0, 12.0)), user="u1", account="x"),
)


def same_terms(a: TrainerTerms, b: TrainerTerms, t_fwd_s: float) -> None:
    for name in ("id", "n_min", "n_max", "current", "rescale_up_s", "rescale_down_s"):
        assert getattr(a, name) == getattr(b, name), name
    assert (a.runnable, a.current_value) == (b.runnable, b.current_value)
    for name in ("bp_nodes", "bp_value"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.scores(t_fwd_s).tobytes() == b.scores(t_fwd_s).tobytes()


@st.composite
def problems(draw: st.DrawFn) -> list[Problem]:
    """Problems in a row on a few fixed spec objects (and copies of them holding other
    nodes), with the pool, T_fwd and the objective's settings changing between them."""
    out = []
    for _ in range(draw(st.integers(1, 8))):
        pool = NODES if draw(st.booleans()) else tuple(n for n in NODES if draw(st.integers(0, 4)))
        free = [n for n in NODES]
        specs = []
        for spec in SPECS:
            if not draw(st.booleans()):
                continue
            if draw(st.integers(0, 3)) == 0:  # another holding: a new spec object
                held = draw(st.integers(0, min(spec.n_max, len(free))))
                spec = spec.with_nodes(tuple(free[:held]))
                free = free[held:]
            elif set(spec.nodes) & set(free) != set(spec.nodes):
                continue
            else:
                free = [n for n in free if n not in spec.nodes]
            specs.append(spec)
        if not out or draw(st.integers(0, 3)) == 0:  # the settings change now and then
            fair_by = draw(st.sampled_from(("trainer", "user", "account")))
            settings_ = {
                "t_fwd_s": draw(st.sampled_from((120.0, 600.0, 1800.0))),
                "objective": draw(st.sampled_from(("throughput", "speedup", "goodput"))),
                "max_trainers": draw(st.integers(1, 3)),
                "fairness_p": draw(st.sampled_from((1.0, 0.5, 0.0, -1.0))),
                "fair_share_speedup": draw(st.booleans()),
                "fair_by": fair_by,
                "fair_weights": {"u1": 2.0} if fair_by == "user" else {},
            }
        out.append(Problem(pool=pool, trainers=tuple(specs), **settings_))  # type: ignore[arg-type]
    return out


@settings(max_examples=80, deadline=None)
@given(problems())
def test_reused_terms_are_the_terms_built_afresh(run: list[Problem]) -> None:
    objective._TERMS.clear()
    for problem in run:
        kept = build_terms(problem)
        saved = dict(objective._TERMS)
        objective._TERMS.clear()
        fresh = build_terms(problem)
        objective._TERMS.clear()
        objective._TERMS.update(saved)
        assert len(kept) == len(fresh)
        for a, b in zip(kept, fresh, strict=True):
            same_terms(a, b, problem.t_fwd_s)


def test_a_spec_seen_again_gets_its_terms_and_another_pool_new_ones() -> None:
    objective._TERMS.clear()
    spec = SPECS[0].with_nodes(("n00",))
    problem = Problem(pool=NODES, trainers=(spec,))
    first = build_terms(problem)[0]
    assert build_terms(Problem(pool=NODES, trainers=(spec,)))[0] is first
    # The pool below n_max caps it: other terms.
    assert build_terms(Problem(pool=NODES[:3], trainers=(spec,)))[0].n_max == 3
    # Its node left the pool: it holds nothing now.
    assert build_terms(Problem(pool=NODES[1:], trainers=(spec,)))[0].current == ()


def test_the_cache_keeps_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objective, "_TERMS_MAX", 2)
    objective._TERMS.clear()
    for spec in SPECS:
        build_terms(Problem(pool=NODES, trainers=(spec,)))
    assert [v[0].id for v in objective._TERMS.values()] == ["b", "c"]


@pytest.mark.parametrize("solver", ["dp", "highs"])
def test_allocations_with_reused_terms_are_the_fresh_ones(solver: str) -> None:
    specs = tuple(s.with_nodes(()) for s in SPECS)
    answers = []
    for reuse in (True, False):
        objective._TERMS.clear()
        got = []
        for size in (10, 6, 10, 3, 10):
            if not reuse:
                objective._TERMS.clear()
            problem = Problem(pool=NODES[:size], trainers=specs, t_fwd_s=600.0)
            got.append(allocate(problem, solver=solver).nodes)
        answers.append(got)
    assert answers[0] == answers[1]


def test_terms_keep_a_few_score_tables_and_give_the_same_after_dropping_one() -> None:
    """Terms outlive a decision now, and T_fwd "auto" moves between decisions: a table per
    T_fwd ever asked would grow for as long as the trainer is unchanged."""
    problem = Problem(pool=NODES, trainers=SPECS, t_fwd_s=120.0)
    (terms, *_) = build_terms(problem)
    first = terms.scores(60.0).copy()
    for t_fwd in range(100, 100 + 10 * objective.SCORES_KEPT, 10):
        terms.scores(float(t_fwd))
    assert len(terms._scores) == objective.SCORES_KEPT
    assert 60.0 not in terms._scores
    assert terms.scores(60.0).tobytes() == first.tobytes()  # made again, the same
