"""best_config against brute force over the feasible grid; the curve for the allocator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bftrainer.trainers.goodput import (
    BatchLimits,
    BatchLimitsError,
    GoodputModel,
    NoFeasibleConfigError,
)
from bftrainer.trainers.throughput import StepObservation, ThroughputParams, fit_throughput

PARAMS = ThroughputParams(0.05, 0.002, 0.02, 0.003, 0.1, 0.01, 2.5)


def brute_force(model: GoodputModel, nodes: int) -> tuple[float, int, int] | None:
    """(goodput, local_bsz, accum_steps) maximising goodput over every feasible pair."""
    lim = model.limits
    k = nodes * model.replicas_per_node
    best = None
    for s in range(lim.max_accum_steps + 1):
        m = np.arange(lim.min_local_bsz, lim.max_local_bsz + 1)
        batch = k * m * (s + 1)
        ok = (batch >= lim.base_batch_size) & (batch <= lim.max_batch_size)
        if not ok.any():
            continue
        values = model.goodput(nodes, m[ok], s)
        i = int(np.argmax(values))
        if best is None or values[i] > best[0]:
            best = (float(values[i]), int(m[ok][i]), s)
    return best


times = st.floats(min_value=1e-4, max_value=1.0)


@st.composite
def models(draw: st.DrawFn) -> GoodputModel:
    params = ThroughputParams(
        alpha_grad_s=draw(times),
        beta_grad_s=draw(st.floats(min_value=1e-6, max_value=1e-2)),
        alpha_intra_s=draw(times),
        beta_intra_s=draw(st.floats(min_value=0.0, max_value=0.1)),
        alpha_inter_s=draw(times),
        beta_inter_s=draw(st.floats(min_value=0.0, max_value=0.1)),
        gamma=draw(st.floats(min_value=1.0, max_value=10.0)),
    )
    base = draw(st.integers(min_value=1, max_value=256))
    min_local = draw(st.integers(min_value=1, max_value=4))
    limits = BatchLimits(
        base_batch_size=base,
        max_batch_size=base * draw(st.integers(min_value=1, max_value=64)),
        max_local_bsz=draw(st.integers(min_value=min_local, max_value=300)),
        min_local_bsz=min_local,
        max_accum_steps=draw(st.integers(min_value=0, max_value=4)),
    )
    pgns = draw(st.one_of(st.floats(min_value=0.0, max_value=1e5), st.just(float("inf"))))
    return GoodputModel(params, pgns, limits, replicas_per_node=draw(st.sampled_from([1, 2, 6])))


@settings(max_examples=150, deadline=None)
@given(model=models(), nodes=st.integers(min_value=1, max_value=40))
def test_best_config_matches_brute_force(model: GoodputModel, nodes: int) -> None:
    expected = brute_force(model, nodes)
    if expected is None:
        with pytest.raises(NoFeasibleConfigError):
            model.best_config(nodes)
        return
    got = model.best_config(nodes)
    assert got.goodput_sps == pytest.approx(expected[0], rel=1e-9)
    lim = model.limits
    assert lim.min_local_bsz <= got.local_bsz <= lim.max_local_bsz
    assert 0 <= got.accum_steps <= lim.max_accum_steps
    assert lim.base_batch_size <= got.batch_size <= lim.max_batch_size
    assert got.batch_size == got.replicas * got.local_bsz * (got.accum_steps + 1)


def limits(**kw: int) -> BatchLimits:
    base = {"base_batch_size": 64, "max_batch_size": 8192, "max_local_bsz": 256}
    base.update(kw)
    return BatchLimits(**base)


def test_more_noise_means_bigger_batches() -> None:
    quiet = GoodputModel(PARAMS, 100.0, limits()).best_config(4)
    noisy = GoodputModel(PARAMS, 10_000.0, limits()).best_config(4)
    assert noisy.batch_size > quiet.batch_size
    assert noisy.efficiency > quiet.efficiency


def test_accumulation_is_used_past_the_memory_bound() -> None:
    # Very noisy gradients want big batches; memory allows 16 per replica.
    model = GoodputModel(PARAMS, 1e6, limits(max_local_bsz=16, max_accum_steps=7))
    c = model.best_config(4)
    assert c.local_bsz == 16 and c.accum_steps > 0
    no_accum = GoodputModel(PARAMS, 1e6, limits(max_local_bsz=16, max_accum_steps=0))
    assert no_accum.best_config(4).accum_steps == 0
    assert no_accum.best_config(4).goodput_sps < c.goodput_sps


def test_base_batch_reachable_only_with_enough_nodes() -> None:
    model = GoodputModel(
        PARAMS, 100.0, limits(base_batch_size=512, max_local_bsz=64, max_accum_steps=1)
    )
    with pytest.raises(NoFeasibleConfigError, match="base_batch_size 512"):
        model.best_config(2)  # 2 x 64 x 2 = 256 < 512
    assert model.best_config(4).batch_size >= 512


def test_too_many_nodes_for_the_batch_limit() -> None:
    model = GoodputModel(PARAMS, 100.0, limits(max_batch_size=256), replicas_per_node=4)
    assert model.max_feasible_nodes() == 64
    with pytest.raises(NoFeasibleConfigError, match="exceeds max_batch_size 256"):
        model.best_config(65)


def test_curve_has_every_node_count_and_the_best_goodput() -> None:
    model = GoodputModel(PARAMS, 2000.0, limits(), max_nodes_seen=16)
    curve = model.curve(2, 20)
    assert [n for n, _ in curve] == list(range(2, 21))
    for n, value in curve:
        assert value == pytest.approx(model.best_config(n).goodput_sps)


def test_curve_is_flat_past_the_exploration_cap() -> None:
    model = GoodputModel(PARAMS, 2000.0, limits(), max_nodes_seen=3)
    assert model.node_limit(1, 100) == 6
    curve = model.curve(1, 100)
    assert [n for n, _ in curve] == [1, 2, 3, 4, 5, 6, 100]
    assert curve[-1][1] == curve[-2][1]
    # the cap never cuts below the trainer's minimum
    assert model.node_limit(10, 100) == 10


def test_cap_comes_from_the_fitted_model() -> None:
    obs = [
        StepObservation(n, n, m, 0, 0.05 + 0.001 * m + 0.02 * (n > 1))
        for n in (1, 2)
        for m in (16, 64)
    ]
    model = GoodputModel(fit_throughput(obs), 500.0, limits())
    assert model.max_nodes_seen == 2 and model.node_limit(1, 64) == 4


def test_curve_thinning_keeps_the_ends_and_interpolates_well() -> None:
    model = GoodputModel(PARAMS, 2000.0, limits(max_batch_size=1 << 20))
    full = model.curve(1, 200)
    thin = model.curve(1, 200, max_points=12)
    assert len(thin) == 12
    assert thin[0] == full[0] and thin[-1] == full[-1]
    xs = [n for n, _ in thin]
    ys = [v for _, v in thin]
    interp = np.interp([n for n, _ in full], xs, ys)
    peak = max(v for _, v in full)
    assert np.max(np.abs(interp - [v for _, v in full])) < 0.03 * peak


def test_curve_gives_zero_where_no_configuration_fits() -> None:
    model = GoodputModel(
        PARAMS, 100.0, limits(base_batch_size=512, max_local_bsz=64, max_accum_steps=1)
    )
    curve = dict(model.curve(1, 8))
    assert curve[1] == curve[2] == curve[3] == 0.0 and curve[4] > 0


def test_no_pgns_is_pessimistic() -> None:
    unknown = GoodputModel(PARAMS, None, limits())
    assert unknown.best_config(1).batch_size == pytest.approx(64, rel=0.2)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_batch_size": 32}, "max_batch_size 32 < base_batch_size 64"),
        ({"min_local_bsz": 300}, "max_local_bsz 256 < min_local_bsz 300"),
        ({"max_accum_steps": -1}, "max_accum_steps"),
        ({"base_batch_size": 0}, "base_batch_size"),
    ],
)
def test_bad_limits_are_named(kw: dict[str, int], match: str) -> None:
    with pytest.raises(BatchLimitsError, match=match):
        limits(**kw)
