"""A rollback after a failed collective resumes from the newest durable commit.

Horovod restores every survivor to its in-memory copy of the last commit it completed.
A peer that dies after rank 0 wrote a commit's checkpoint, but before the others kept
that commit in memory, would send the survivors back one commit further than what is on
disk; the runtime then takes the checkpoint (one process, the real runtime and torch).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bftrainer.trainers.comm import SingleComm
from bftrainer.trainers.runtime import ElasticRuntime, add_runtime_args


def make_runtime(trainer_dir: Path, work: int) -> ElasticRuntime:
    parser = argparse.ArgumentParser()
    add_runtime_args(parser)
    args = parser.parse_args(
        [
            "--work-samples", str(work),
            "--commit-every-steps", "5",
            "--base-batch", "16",
            "--trainer-dir", str(trainer_dir),
            "--trainer-id", "rollback",
        ]
    )  # fmt: skip
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(256, 4), torch.randint(0, 2, (256,))
    dataset = list(zip(x, y, strict=True))

    def fetch(ids: object) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(ids)
        return x[index], y[index]

    def loss_fn(m: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(m(batch[0]), batch[1])

    return ElasticRuntime(
        args, model, optimizer, dataset, loss_fn, fetch=fetch, comm=SingleComm(), script="t"
    )


def test_rollback_takes_the_checkpoint_when_it_is_newer(tmp_path: Path) -> None:
    rank0 = make_runtime(tmp_path, work=320)
    survivor = make_runtime(tmp_path, work=320)  # same trainer directory, nothing on disk yet
    kept_in_memory = survivor.snapshot()  # its last completed commit: step 0
    result = rank0.run()  # commits every 5 steps, writing the checkpoint each time
    assert result is not None and result["steps"] > 5

    survivor.rollback(kept_in_memory)
    assert survivor.progress.step == result["steps"]
    assert survivor.progress.samples_done == 320
    for mine, theirs in zip(survivor.model.parameters(), rank0.model.parameters(), strict=True):
        assert torch.equal(mine, theirs)


def test_rollback_keeps_the_in_memory_commit_when_the_disk_is_older(tmp_path: Path) -> None:
    runtime = make_runtime(tmp_path, work=320)
    runtime.run()
    ahead = runtime.snapshot()
    ahead["progress"] = {**ahead["progress"], "step": ahead["progress"]["step"] + 7}
    runtime.rollback(ahead)
    assert runtime.progress.step == ahead["progress"]["step"]
