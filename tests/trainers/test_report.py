"""``runtime.report``: a trainer's own metric, keyed by samples seen, lands durably in
its trainer directory at each commit and at the end, where a search reads it
(``channel.read_reports``, bftrainer.hpo). The real runtime in one process."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from bftrainer.trainers import channel
from bftrainer.trainers.comm import SingleComm
from bftrainer.trainers.runtime import ElasticRuntime, RuntimeConfigError, add_runtime_args


def runtime(tmp_path: Path, *extra: str, evaluate: object = None) -> ElasticRuntime:
    parser = argparse.ArgumentParser()
    add_runtime_args(parser)
    args = parser.parse_args(
        [
            *("--work-samples", "256", "--base-batch", "16", "--max-batch", "16"),
            *("--commit-every-steps", "4", "--trainer-dir", str(tmp_path)),
            *("--trial", "study#3", *extra),
        ]
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x = torch.randn(64, 3)
    return ElasticRuntime(
        args,
        model,
        torch.optim.SGD(model.parameters(), lr=0.05),
        x,
        lambda m, batch: (m(batch) ** 2).mean(),
        comm=SingleComm(),
        script="rep",
        evaluate=evaluate,  # type: ignore[arg-type]
    )


def test_each_commit_reports_once_keyed_by_samples_and_the_last_is_the_end(
    tmp_path: Path,
) -> None:
    probe = torch.randn(32, 3)
    rt = runtime(tmp_path, evaluate=lambda m: float((m(probe) ** 2).mean().detach()))
    result = rt.run()
    assert result is not None and result["samples"] == 256
    reports, _ = channel.read_reports(tmp_path)
    samples = [r["samples_done"] for r in reports]
    # 4 steps of 16 samples between commits: one report per commit, none repeated.
    assert samples == [64, 128, 192, 256]
    assert all(r["trial"] == "study#3" for r in reports)
    # The loss of this regression falls as it trains: the reports are the model's own.
    assert reports[-1]["value"] < reports[0]["value"]


def test_a_restarted_trainer_reports_from_its_commit(tmp_path: Path) -> None:
    rt = runtime(tmp_path, evaluate=lambda m: 1.0)
    rt.run()
    # The same directory, more work: it resumes at 256 samples and reports past it.
    again = runtime(tmp_path, "--work-samples", "320", evaluate=lambda m: 2.0)
    again.run()
    reports, _ = channel.read_reports(tmp_path)
    assert [(r["samples_done"], r["value"]) for r in reports][-2:] == [(256, 1.0), (320, 2.0)]


def test_a_value_that_is_not_finite_is_refused_in_one_line(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    with pytest.raises(RuntimeConfigError, match=r"report\(nan\) at 0 samples"):
        rt.report(float("nan"))
    assert channel.read_reports(tmp_path)[0] == []
