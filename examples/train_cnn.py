"""An elastic trainer with mixed precision: a small convolutional net on synthetic images.

    python examples/train_cnn.py --work-epochs 2 [--device auto|cpu|cuda]
    bftrainer run --backend torchrun --hosts-file hosts.txt examples/train_cnn.py

The forward pass runs under ``torch.autocast`` (float16 on a GPU, bfloat16 on the CPU)
and the runtime is given a ``torch.amp.GradScaler``: it scales the loss before
``backward()``, sums the scaled gradients over the replicas, unscales them before the
agent measures the gradient noise (so the noise scale is of the true gradients), and
steps through the scaler, which skips a step whose gradients overflowed on every rank
alike. The images are 3 x 32 x 32: each class is a fixed random pattern, seen through
noise, so the task is learnable and its gradient noise is real.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from bftrainer.trainers.device import DEVICE_CHOICES, select_device
from bftrainer.trainers.runtime import ElasticRuntime, add_runtime_args


def synthetic_images(
    n: int, classes: int, noise: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(classes, 3, 32, 32, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    x = patterns[y] + noise * torch.randn(n, 3, 32, 32, generator=g)
    return x, y


def build_model(classes: int, width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(2 * width, 4 * width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, classes),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=4096, help="data set size")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--width", type=int, default=16, help="channels of the first layer")
    parser.add_argument("--noise", type=float, default=2.0, help="pixel noise over the pattern")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    add_runtime_args(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    device = select_device(args.device)
    half = torch.float16 if device.type == "cuda" else torch.bfloat16
    x, y = synthetic_images(args.samples, args.classes, args.noise, args.seed)
    x, y = x.to(device), y.to(device)
    model = build_model(args.classes, args.width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type)

    def fetch(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[idx], y[idx]  # ids on the device (device_ids): nothing from the host

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, labels = batch
        with torch.autocast(device.type, dtype=half):
            return nn.functional.cross_entropy(model(inputs), labels)

    runtime = ElasticRuntime(
        args,
        model,
        optimizer,
        x,
        loss_fn,
        fetch=fetch,
        device_ids=True,
        grad_scaler=scaler,
        script=__file__,
    )
    runtime.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
