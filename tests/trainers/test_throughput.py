"""The step-time model: its equations, its fit, its priors, and the observations CSV."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from bftrainer.trainers.throughput import (
    FitError,
    ObservationError,
    ObservationFileError,
    StepObservation,
    ThroughputParams,
    fit_throughput,
    predict_step_time,
    read_observations_csv,
)

TRUE = ThroughputParams(
    alpha_grad_s=0.05,
    beta_grad_s=0.002,
    alpha_intra_s=0.02,
    beta_intra_s=0.003,
    alpha_inter_s=0.1,
    beta_inter_s=0.01,
    gamma=2.5,
)


def synthetic(params: ThroughputParams, noise: float, seed: int) -> list[StepObservation]:
    """Step times of a grid of configurations from ``params``, with log-normal noise."""
    rng = np.random.default_rng(seed)
    out = []
    for n, r, m, s in itertools.product([1, 2, 3, 4, 6, 8], [1, 2, 4], [8, 32, 128], [0, 1]):
        t = float(predict_step_time(params, n, n * r, m, s)) * float(np.exp(rng.normal(0, noise)))
        out.append(StepObservation(n, n * r, m, s, t))
    return out


def mean_relative_error(model_params: ThroughputParams, obs: list[StepObservation]) -> float:
    pred = predict_step_time(
        model_params,
        [o.nodes for o in obs],
        [o.replicas for o in obs],
        [o.local_bsz for o in obs],
        [o.accum_steps for o in obs],
    )
    true = np.array([o.step_time_s for o in obs])
    return float(np.mean(np.abs(pred - true) / true))


def test_equations_by_hand() -> None:
    p = ThroughputParams(0.1, 0.01, 0.2, 0.05, 0.3, 0.1, 1.0)
    # one replica: no sync; s = 2 adds 2 x T_grad
    assert predict_step_time(p, 1, 1, 10, 2) == pytest.approx(3 * (0.1 + 0.1))
    # one node, 4 replicas, gamma 1: T_grad + a_intra + b_intra * 2
    assert predict_step_time(p, 1, 4, 10, 0) == pytest.approx(0.2 + 0.2 + 0.1)
    # 2 nodes, 8 replicas: inter-node pair
    assert predict_step_time(p, 2, 8, 10, 0) == pytest.approx(0.2 + 0.3 + 0.6)
    # gamma 10: nearly perfect overlap, close to max(T_grad, T_sync)
    q = ThroughputParams(0.1, 0.01, 0.2, 0.05, 0.3, 0.1, 10.0)
    assert predict_step_time(q, 2, 8, 10, 0) == pytest.approx(0.9, rel=1e-3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_reproduces_the_profile_it_was_fitted_on_within_10_percent(seed: int) -> None:
    obs = synthetic(TRUE, noise=0.03, seed=seed)
    model = fit_throughput(obs)
    assert mean_relative_error(model.params, obs) < 0.10
    # and it predicts unseen configurations of the same system well too
    held_out = [StepObservation(n, 4 * n, 64, 0, 1.0) for n in (5, 7, 12)]
    pred = model.step_time_s([5, 7, 12], [20, 28, 48], 64)
    true = predict_step_time(TRUE, [5, 7, 12], [20, 28, 48], 64)
    assert np.all(np.abs(pred - true) / true < 0.10), held_out
    assert model.max_nodes_seen == 8 and model.max_replicas_seen == 32


def test_exact_data_is_fitted_almost_exactly() -> None:
    model = fit_throughput(synthetic(TRUE, noise=0.0, seed=0))
    assert model.rmsle < 0.01


def test_single_node_data_assume_perfect_scaling() -> None:
    obs = [StepObservation(1, 1, m, 0, 0.05 + 0.002 * m) for m in (8, 16, 32, 64)]
    model = fit_throughput(obs)
    p = model.params
    assert (p.alpha_inter_s, p.beta_inter_s, p.alpha_intra_s, p.beta_intra_s) == (0, 0, 0, 0)
    one = model.step_time_s(1, 1, 32)
    assert model.step_time_s(16, 16, 32) == pytest.approx(one)
    assert model.max_nodes_seen == 1


def test_unseen_inter_node_sync_follows_the_intra_node_one() -> None:
    obs = [StepObservation(1, 1, m, 0, 0.05 + 0.002 * m) for m in (8, 32)]
    obs += [StepObservation(1, 4, m, 0, 0.1 + 0.002 * m) for m in (8, 32)]
    p = fit_throughput(obs).params
    assert p.alpha_inter_s == p.alpha_intra_s > 0
    assert p.beta_inter_s == p.beta_intra_s


def test_one_local_batch_size_fixes_half_the_compute_as_overhead() -> None:
    obs = [StepObservation(1, 1, 32, 0, 0.2), StepObservation(1, 1, 32, 0, 0.2)]
    model = fit_throughput(obs)
    assert model.params.alpha_grad_s == pytest.approx(0.1)
    assert model.step_time_s(1, 1, 32) == pytest.approx(0.2, rel=1e-3)
    assert model.step_time_s(1, 1, 64) == pytest.approx(0.3, rel=1e-3)  # sub-linear growth


def test_fit_needs_observations() -> None:
    with pytest.raises(FitError):
        fit_throughput([])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nodes": 0}, "nodes"),
        ({"replicas": 1, "nodes": 2}, "replicas 1 < nodes 2"),
        ({"local_bsz": 0}, "local_bsz"),
        ({"accum_steps": -1}, "accum_steps"),
        ({"step_time_s": 0.0}, "step_time_s"),
        ({"step_time_s": float("nan")}, "step_time_s"),
    ],
)
def test_bad_observations_are_named(kwargs: dict[str, float], match: str) -> None:
    base: dict[str, float] = {
        "nodes": 1,
        "replicas": 1,
        "local_bsz": 8,
        "accum_steps": 0,
        "step_time_s": 0.1,
    }
    base.update(kwargs)
    with pytest.raises(ObservationError, match=match):
        StepObservation(**base)


def test_params_reject_out_of_range_values() -> None:
    with pytest.raises(ValueError, match="gamma"):
        ThroughputParams(0.1, 0.1, 0, 0, 0, 0, 0.5)
    with pytest.raises(ValueError, match="beta_grad_s"):
        ThroughputParams(0.1, -1.0, 0, 0, 0, 0, 1.0)


def test_csv_reading_defaults_replicas_to_nodes(tmp_path: Path) -> None:
    path = tmp_path / "obs.csv"
    path.write_text(
        "nodes,local_bsz,accum_steps,step_time_s,replicas\n2,32,1,0.5,\n2,32,0,0.25,8\n"
    )
    obs = read_observations_csv(path)
    assert obs == [StepObservation(2, 2, 32, 1, 0.5), StepObservation(2, 8, 32, 0, 0.25)]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("nodes,local_bsz,step_time_s\n1,2,3\n", r"obs.csv:1: missing column\(s\) accum_steps"),
        ("nodes,local_bsz,accum_steps,step_time_s\n1,8,0,0.1\n1,x,0,0.1\n", "obs.csv:3: local_bsz"),
        ("nodes,local_bsz,accum_steps,step_time_s\n1.5,8,0,0.1\n", "obs.csv:2: nodes .* whole"),
        ("nodes,local_bsz,accum_steps,step_time_s\n1,8,0,-2\n", "obs.csv:2: step_time_s"),
        ("nodes,local_bsz,accum_steps,step_time_s\n", "obs.csv: no observation rows"),
    ],
)
def test_csv_errors_name_file_and_line(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "obs.csv"
    path.write_text(text)
    with pytest.raises(ObservationFileError, match=match):
        read_observations_csv(path)


def test_missing_csv_is_named(tmp_path: Path) -> None:
    with pytest.raises(ObservationFileError, match=r"nope\.csv"):
        read_observations_csv(tmp_path / "nope.csv")
