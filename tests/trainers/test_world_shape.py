"""Under Horovod the world changes shape without a new process: after a grow onto a
node's other slot, a worker that started alone on its node and one that started beside
it must count the same replicas. They did not: each agent counted replicas per node as
its process started, so the two ranks planned different batches and learning rates for
the step after the reset, and their models drifted apart (``ReplicaDivergenceError`` in
the shared-node end-to-end test). Here the real runtime and agent, in one process, with
a communicator whose shape the test sets and whose broadcasts carry rank 0's message.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from bftrainer.trainers.comm import SingleComm
from bftrainer.trainers.runtime import ElasticRuntime, add_runtime_args


class Shaped(SingleComm):
    """A rank of a world of ``size`` replicas, ``local_size`` on its node; a broadcast
    returns ``from_rank0`` on other ranks (what rank 0 sent), its own object on rank 0."""

    def __init__(self, rank: int, size: int, local_size: int) -> None:
        self.rank, self.size, self.local_size = rank, size, local_size  # type: ignore[misc]
        self.from_rank0: Any = None
        self.sent: Any = None

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        if self.rank == root:
            self.sent = obj
            return obj
        return self.from_rank0


def runtime(tmp_path: Path, comm: Shaped) -> ElasticRuntime:
    parser = argparse.ArgumentParser()
    add_runtime_args(parser)
    limits = ["--work-samples", "64", "--base-batch", "8", "--max-batch", "64"]
    args = parser.parse_args([*limits, "--trainer-dir", str(tmp_path), "--trainer-id", "shape"])
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 3)
    return ElasticRuntime(
        args,
        model,
        optimizer,
        x,
        lambda m, batch: m(batch).sum(),
        comm=comm,
        script="shape",
    )


def test_ranks_started_in_different_shapes_count_the_same_replicas(tmp_path: Path) -> None:
    # The survivor started alone on its node; the newcomer started in the grown world.
    survivor = Shaped(rank=0, size=1, local_size=1)
    old = runtime(tmp_path / "old", survivor)
    newcomer = Shaped(rank=1, size=2, local_size=2)
    new = runtime(tmp_path / "new", newcomer)
    # Horovod's reset: the survivor's world is now the newcomer's.
    survivor.size, survivor.local_size = 2, 2  # type: ignore[misc]
    old._reset()
    newcomer.from_rank0 = survivor.sent
    new._reset()
    assert old.agent.config == new.agent.config
    assert old.agent.config.replicas == 2 and old.agent.config.nodes == 1
    assert old.agent.lr_factor == new.agent.lr_factor
    assert [g["lr"] for g in old.optimizer.param_groups] == [
        g["lr"] for g in new.optimizer.param_groups
    ]
