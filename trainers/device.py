"""Which device a worker trains on: its slot's GPU, or the CPU.

A launcher starts one worker per slot and tells it its local rank (``LOCAL_RANK`` under
torchrun, ``HOROVOD_LOCAL_RANK`` under Horovod, 0 alone). With ``CUDA_VISIBLE_DEVICES``
naming the node's GPUs (or a slot's own, when the holder pins them), the worker takes
the visible GPU of its local rank, modulo their number; without a GPU it takes the CPU.
The runtime itself learns the device from the model's parameters
(:attr:`bftrainer.trainers.runtime.ElasticRuntime.device`).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "cpu", "cuda")
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "HOROVOD_LOCAL_RANK")


class DeviceError(ValueError):
    """A device that cannot be used here (names it and why)."""


def local_rank() -> int:
    """This worker's rank on its node, from the launcher's environment (0 alone)."""
    for name in LOCAL_RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise DeviceError(f"{name}={value!r} is not an integer") from None
    return 0


def select_device(choice: str = "auto") -> torch.device:
    """``auto``: the slot's GPU where CUDA has one, else the CPU; ``cuda`` insists on a
    GPU; ``cpu`` takes the CPU. Makes the GPU the current one (NCCL and the caching
    allocator then use it without a ``device=`` everywhere)."""
    import torch

    if choice not in DEVICE_CHOICES:
        raise DeviceError(f"device {choice!r}: expected one of {', '.join(DEVICE_CHOICES)}")
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise DeviceError(
            "device cuda: no GPU is visible here "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    device = torch.device("cuda", local_rank() % count)
    torch.cuda.set_device(device)
    return device


def model_device(model: object) -> torch.device:
    """The device of the model's trainable parameters (all must share one)."""
    import torch

    devices = {p.device for p in model.parameters() if p.requires_grad}  # type: ignore[attr-defined]
    if not devices:
        return torch.device("cpu")
    if len(devices) > 1:
        names = ", ".join(sorted(str(d) for d in devices))
        raise DeviceError(f"the model's parameters lie on several devices ({names}): one expected")
    return devices.pop()
