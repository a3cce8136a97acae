"""The bucketed gradient sum: the exact sum over real ranks, flags included, on each device.

Two real processes in a torch.distributed group (gloo; on a GPU machine the same test
also runs with the model on the GPU) run the runtime's reducer with tiny buckets (many
of them, started from the hooks while backward runs) over micro-steps of gradient
accumulation, where one rank has no sample in the last micro-step and none at all in
another step. Each rank also computes, alone, the gradient of the whole step's loss:
the reducer's sums must equal it, and the flags must come back summed.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bftrainer.trainers.comm import TorchDistComm
from bftrainer.trainers.reducer import GradientReducer, LaggedFlags

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3), torch.nn.Linear(3, 2)
    ).to(device)


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(x), y, reduction="sum")


def _worker(rank: int, port: int, device: str, zero: str, out: Path) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # gloo sums CUDA tensors too: one GPU serves both
    comm = TorchDistComm()
    model = _model(device)
    params = list(model.parameters())
    reducer = GradientReducer(params, comm, 3, device=torch.device(device), bucket_bytes=64)
    lagged = LaggedFlags(3, torch.device(device), reducer.flags_dtype)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(40, 5, generator=g).to(device), torch.randint(0, 2, (40,), generator=g)
    y = y.to(device)
    # Per step and rank: the micro-batches' sample ids (rank 1 idle in parts of steps).
    steps = [
        {0: [[0, 1, 2], [3, 4]], 1: [[5, 6], []]},
        {0: [[7, 8, 9, 10]], 1: [[]]},
        {0: [[11], [12], [13]], 1: [[14], [15, 16], [17]]},
    ]
    results: list[Any] = []
    previous = None
    for i, step in enumerate(steps):
        total = sum(len(ids) for micro in step.values() for ids in micro)
        if zero == "reducer":  # the runtime's way: .grad stay views into the buckets
            reducer.zero_grad()
        else:  # dropped as an optimizer's zero_grad does: formed anew, then copied in
            for p in params:
                p.grad = None
        micro = step[rank]
        for j, ids in enumerate(micro):
            if j == len(micro) - 1:
                reducer.arm()
            if ids:
                (_loss(model, x[ids], y[ids]) / total).backward()
        summed = reducer.finish((float(rank + 1), float(i), 0.5 if rank == 0 else 0.0))
        got = [p.grad.detach().cpu().clone() for p in params]
        in_buckets = all(
            p.grad is b.grads[k] for b in reducer.buckets for k, p in enumerate(b.params)
        )
        agreed = lagged.exchange(summed, i)
        # The reference: the whole step's mean loss, in this process alone.
        reference = _model(device)
        every = [k for r in (0, 1) for ids in step[r] for k in ids]
        (_loss(reference, x[every], y[every]) / total).backward()
        want = [p.grad.detach().cpu() for p in reference.parameters()]
        results.append(
            {
                "match": all(
                    torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want, strict=True)
                ),
                "flags": summed.cpu().tolist(),
                "in_buckets": in_buckets,
                "agreed": agreed,
                "previous": previous,
            }
        )
        previous = (summed.cpu().tolist(), i)
    reducer.close()
    dist.destroy_process_group()
    if rank == 0:
        torch.save(results, out)


@pytest.mark.parametrize("zero", ["reducer", "none"])
@pytest.mark.parametrize("device", DEVICES)
def test_buckets_sum_the_step_exactly_and_carry_the_flags(
    tmp_path: Path, device: str, zero: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spawned workers get this process's sys.path and import this module by name.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "results.pt"
    mp.start_processes(_worker, args=(port, device, zero, out), nprocs=2, start_method="spawn")
    results = torch.load(out)
    assert len(results) == 3
    for i, r in enumerate(results):
        assert r["match"], f"step {i}: summed gradients differ from the step's gradient"
        assert r["flags"] == [3.0, 2.0 * i, 0.5]
        # The sums are in .grad without a copy: each is a view into its bucket.
        assert r["in_buckets"], f"step {i}: a .grad is not its bucket's view"
        # The flags of a step are read at the next one, exactly as they were summed.
        assert r["agreed"] == r["previous"]
    assert results[0]["agreed"] is None


def test_a_reducer_with_many_buckets_starts_them_in_order() -> None:
    """Buckets start in index order whatever order their gradients arrive in: the
    order every rank must issue its collectives in."""
    model = _model("cpu")
    started: list[str] = []

    class Recording:
        def allreduce_sum_async(self, tensor: torch.Tensor, name: str) -> Any:
            started.append(name)
            return type("Done", (), {"wait": lambda self: None})()

    reducer = GradientReducer(
        list(model.parameters()),
        Recording(),  # type: ignore[arg-type]
        2,
        device=torch.device("cpu"),
        bucket_bytes=64,
    )
    assert len(reducer.buckets) >= 3
    reducer.arm()
    _loss(model, torch.randn(4, 5), torch.tensor([0, 1, 0, 1])).backward()
    assert started == [b.name for b in reducer.buckets[:-1]]  # all but the flags' bucket
    reducer.finish((1.0, 2.0))
    assert started == [b.name for b in reducer.buckets]
    reducer.close()
