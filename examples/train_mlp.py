"""A small, complete elastic trainer: an MLP classifier on synthetic data.

Run it by hand on one process, or elastically on a host list that changes:

    python examples/train_mlp.py --work-samples 20000 [--device auto|cpu|cuda]
    bftrainer run --backend torchrun --hosts-file hosts.txt \
        examples/train_mlp.py --work-samples 20000
    bftrainer run --backend horovod --hosts-file hosts.txt \
        examples/train_mlp.py --work-samples 20000

The model, optimizer, data set and loss are the user's; the runtime
(bftrainer.trainers.runtime) owns elastic state, batch size, learning rate, commits and
reporting. ``--device auto`` trains on the worker's GPU where there is one (its slot's,
by local rank), else on the CPU; the data set lives on that device, so a step copies
only its sample ids there. ``--ledger FILE`` appends each commit's sample ids to FILE
(used by tests to check that every epoch covers each sample exactly once).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

from bftrainer.trainers.device import DEVICE_CHOICES, select_device
from bftrainer.trainers.runtime import CommitInfo, ElasticRuntime, add_runtime_args


def synthetic_data(n: int, features: int, classes: int, seed: int) -> tuple[torch.Tensor, ...]:
    """A learnable task: labels from a fixed random linear teacher, plus noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    y = (x @ teacher + 0.5 * torch.randn(n, classes, generator=g)).argmax(dim=1)
    return x, y


def build_model(features: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=8192, help="data set size")
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    parser.add_argument("--ledger", type=Path, help="append each commit's sample ids here")
    parser.add_argument(
        "--step-delay-s",
        type=float,
        default=0.0,
        help="sleep per step (tests: a trainer still running when the test looks)",
    )
    parser.add_argument(
        "--hold-file",
        type=Path,
        help="sleep --step-delay-s per step only while this file exists: a test holds the "
        "trainer running while it watches, then deletes the file to let it finish at full speed",
    )
    parser.add_argument(
        "--start-hold-file",
        type=Path,
        help="wait before training while this file exists (tests: workers still starting, "
        "as with a large model to load, when the test rescales them)",
    )
    parser.add_argument(
        "--fail-at-step", type=int, help="raise at this step (for tests of failures)"
    )
    add_runtime_args(parser)
    args = parser.parse_args(argv)
    while args.start_hold_file is not None and args.start_hold_file.exists():
        time.sleep(0.1)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    device = select_device(args.device)
    x, y = synthetic_data(args.samples, args.features, args.classes, args.seed)
    x, y = x.to(device), y.to(device)
    model = build_model(args.features, args.hidden, args.classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    steps = 0

    def fetch(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[idx], y[idx]  # ids on the device (device_ids): nothing from the host

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        nonlocal steps
        steps += 1
        if args.fail_at_step is not None and runtime.progress.step >= args.fail_at_step:
            raise RuntimeError(f"failing on purpose at step {runtime.progress.step}")
        if args.step_delay_s and (args.hold_file is None or args.hold_file.exists()):
            time.sleep(args.step_delay_s)
        inputs, labels = batch
        return nn.functional.cross_entropy(model(inputs), labels)

    def on_commit(info: CommitInfo) -> None:
        assert args.ledger is not None
        line = {
            "from_step": info.from_step,
            "to_step": info.to_step,
            "samples_done": info.samples_done,
            "ids": info.ids,
            "time_s": time.time(),
        }
        with args.ledger.open("a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())

    runtime = ElasticRuntime(
        args,
        model,
        optimizer,
        x,
        loss_fn,
        fetch=fetch,
        device_ids=True,
        on_commit=on_commit if args.ledger else None,
        script=__file__,
    )
    assert runtime.device == device  # learnt from the model's parameters
    runtime.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
