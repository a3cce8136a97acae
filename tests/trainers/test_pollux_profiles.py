"""The Pollux profile loader, on a small written profile and on the real data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bftrainer.trainers.pollux_profiles import (
    PolluxProfile,
    ProfileFormatError,
    ProfileNotFoundError,
    ProfileRangeError,
    applications,
    load_profile,
)
from bftrainer.trainers.throughput import fit_throughput, predict_step_time
from tests.shared_data import SHARED

POLLUX = SHARED / "pollux-sim"
needs_data = pytest.mark.skipif(
    not (POLLUX / "traces").is_dir(), reason=f"Pollux data not found at {POLLUX}"
)


def write_profile(root: Path) -> Path:
    app = root / "traces" / "toy"
    app.mkdir(parents=True)
    (app / "placements.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n"
        "1,10,1.0,0.0\n1,20,2.0,0.0\n"
        "11,10,1.5,0.5\n11,20,2.5,0.5\n"
        "12,10,2.0,1.0\n12,20,4.0,1.0\n"
    )
    (app / "scalability.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n4,4,10,3.0,2.0\n4,4,20,4.0,2.0\n"
    )
    (app / "validation-8.csv").write_text(
        "progress,iteration,metric,grad_sqr,grad_var\n10,10,0.5,4.0,2.0\n20,20,0.7,1.0,3.0\n"
    )
    (app / "validation-32.csv").write_text(
        "progress,iteration,metric,grad_sqr,grad_var\n11,3,0.4,8.0,4.0\n21,6,0.6,2.0,6.0\n"
    )
    return root


def test_step_times_interpolate_in_local_batch(tmp_path: Path) -> None:
    p = PolluxProfile("toy", write_profile(tmp_path))
    assert p.step_time(1, 1, 15).step_time_s == pytest.approx(1.5)
    assert p.step_time(2, 2, 20).sync_time_s == pytest.approx(0.5)
    assert p.step_time(4, 4, 15).step_time_s == pytest.approx(3.5)  # from scalability.csv
    with pytest.raises(ProfileRangeError, match="toy: nodes=1, replicas=1, local_bsz=40"):
        p.step_time(1, 1, 40)
    with pytest.raises(ProfileRangeError, match="outside the measured configurations"):
        p.step_time(9, 9, 15)


def test_placements_are_rotated_to_pollux_form(tmp_path: Path) -> None:
    p = PolluxProfile("toy", write_profile(tmp_path))
    # Pollux stores the smallest rotation: (2, 1) is looked up as "12".
    assert p.placement_step_time((2, 1), 20).step_time_s == pytest.approx(4.0)
    assert p.placement_step_time((1, 2), 15).step_time_s == pytest.approx(3.0)
    # an unmeasured placement falls back to (nodes, replicas) interpolation
    assert p.placement_step_time((1, 1, 1, 1), 10).step_time_s == pytest.approx(3.0)


def test_grad_stats_by_batch_and_progress(tmp_path: Path) -> None:
    p = PolluxProfile("toy", write_profile(tmp_path))
    assert p.base_batch_size == 8 and p.batch_sizes == [8, 32]
    assert p.target_progress == 20.0
    first = p.grad_stats(8, 5.0)
    assert (first.grad_sqr, first.grad_var) == (4.0, 2.0)
    assert first.pgns == pytest.approx(2.0 * 8 / 4.0)  # variance at B0 -> per sample
    assert p.grad_stats(8, 15.0).grad_sqr == 1.0
    assert p.grad_stats(8, 99.0).grad_sqr == 1.0  # past the end: the last epoch
    mid = p.grad_stats(16, 5.0)  # halfway between 8 and 32 in log(batch)
    assert mid.grad_sqr == pytest.approx(6.0) and mid.grad_var == pytest.approx(3.0)
    assert p.grad_stats(1000, 5.0).grad_sqr == 8.0  # clamped to the largest table
    assert p.metric(32, 12.0) == 0.6


def test_missing_and_malformed_profiles_are_named(tmp_path: Path) -> None:
    with pytest.raises(ProfileNotFoundError, match="'nope'"):
        PolluxProfile("nope", tmp_path)
    root = write_profile(tmp_path)
    bad = root / "traces" / "toy" / "placements.csv"
    bad.write_text("placement,local_bsz,step_time,sync_time\n1,10,fast,0\n")
    with pytest.raises(ProfileFormatError, match=r"placements.csv:2: step_time is 'fast'"):
        PolluxProfile("toy", root)
    bad.write_text("placement,local_bsz,step_time\n1,10,1.0\n")
    with pytest.raises(ProfileFormatError, match=r"missing column.*sync_time"):
        PolluxProfile("toy", root)


def test_data_directory_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_profile(tmp_path)
    monkeypatch.setenv("BFTRAINER_POLLUX_DATA", str(tmp_path))
    assert applications() == ["toy"]
    assert load_profile("toy").app == "toy"


@needs_data
@pytest.mark.data
def test_real_profiles_load_and_answer_at_measured_points() -> None:
    apps = applications(POLLUX)
    assert set(apps) >= {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}
    cifar = load_profile("cifar10", POLLUX)
    assert cifar.base_batch_size == 128
    # placements.csv row "1,32,0.0427886962890625,..." is the only (1 node, 1 GPU) at 32
    assert cifar.step_time(1, 1, 32).step_time_s == pytest.approx(0.0427886962890625)
    assert cifar.placement_step_time((1,), 32).step_time_s == pytest.approx(0.0427886962890625)
    # beyond placements.csv: 12 nodes x 4 GPUs comes from scalability.csv
    t = cifar.step_time(12, 48, 100).step_time_s
    assert 0.05 < t < 2.0
    stats = cifar.grad_stats(128, 0.0)
    assert stats.grad_sqr == pytest.approx(8.947307535897329)


@needs_data
@pytest.mark.data
def test_throughput_model_fits_every_real_profile_within_10_percent() -> None:
    errors = {}
    for app in applications(POLLUX):
        obs = load_profile(app, POLLUX).observations()
        model = fit_throughput(obs)
        pred = predict_step_time(
            model.params,
            [o.nodes for o in obs],
            [o.replicas for o in obs],
            [o.local_bsz for o in obs],
        )
        true = np.array([o.step_time_s for o in obs])
        errors[app] = float(np.mean(np.abs(pred - true) / true))
    assert all(e < 0.10 for e in errors.values()), errors
