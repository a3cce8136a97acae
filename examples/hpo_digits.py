"""One trial of examples/hpo_optuna.py: an MLP on scikit-learn's handwritten digits.

A trainer script like any other (docs/trainers.md) that takes its hyper-parameters as
options and reports its validation loss at every commit (``evaluate``), which is what a
study's pruner compares. By hand:

    python examples/hpo_digits.py --lr 0.05 --hidden 32 --work-samples 14370

The digits (1,797 8x8 images, 10 classes) ship with scikit-learn: nothing is
downloaded. A fixed fifth of them is held out for the validation loss.

They are read from the CSV file scikit-learn installs, as its ``load_digits`` reads it,
without importing scikit-learn: that import (scipy with it) cost each of a search's
trials about 2 s of CPU, at every rescale (each generation starts its workers afresh).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bftrainer.trainers.device import DEVICE_CHOICES, select_device
from bftrainer.trainers.runtime import ElasticRuntime, add_runtime_args


def digits_csv() -> Path:
    """scikit-learn's ``datasets/data/digits.csv.gz``, found without importing it."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("hpo_digits: the digits ship with scikit-learn; pip install scikit-learn")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"


def digits(device: torch.device) -> tuple[torch.Tensor, ...]:
    """Train and validation tensors: pixels scaled to [0, 1], a fixed 80/20 split."""
    data = np.loadtxt(digits_csv(), delimiter=",")  # 64 pixels (0-16), then the label
    x = torch.tensor(data[:, :-1] / 16.0, dtype=torch.float32)
    y = torch.tensor(data[:, -1].astype(np.int64), dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    cut = len(x) * 4 // 5
    train, val = order[:cut], order[cut:]
    return tuple(t.to(device) for t in (x[train], y[train], x[val], y[val]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    parser.add_argument(
        "--step-delay-s",
        type=float,
        default=0.0,
        help="sleep per step: a trial slow enough to watch (demos and tests)",
    )
    add_runtime_args(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    device = select_device(args.device)
    x, y, x_val, y_val = digits(device)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    def fetch(ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(ids).to(device, non_blocking=True)
        return x[idx], y[idx]

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if args.step_delay_s:
            time.sleep(args.step_delay_s)
        inputs, labels = batch
        return nn.functional.cross_entropy(model(inputs), labels)

    def validation_loss(model: nn.Module) -> float:
        with torch.no_grad():
            loss = float(nn.functional.cross_entropy(model(x_val), y_val))
        # A diverged trial (lr too high) is a bad trial, not a failed one.
        return loss if np.isfinite(loss) else 1e6

    runtime = ElasticRuntime(
        args, model, optimizer, x, loss_fn, fetch=fetch, script=__file__, evaluate=validation_loss
    )
    runtime.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
