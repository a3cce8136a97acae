"""What the elastic runtime (``runtime.py``) records of a run: its progress, checkpointed
with the model and restored by a rollback or a restart (``RunProgress``); what a commit
made durable, handed to the user's ``on_commit`` (``CommitInfo``); and the failure of a
commit whose replicas diverged. A module of its own: plain records that the checkpoint
format and the user's code rely on, apart from the training loop that fills them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bftrainer.trainers.runtime_options import RuntimeConfigError


class ReplicaDivergenceError(RuntimeError):
    """Ranks hold different models at a commit: a bug, never to be trained through."""


@dataclass
class CommitInfo:
    """What a commit made durable: steps ``from_step..to_step`` and their sample ids.

    ``ids`` holds ``(epoch, ids)`` pairs of every rank's processed samples (only when
    the runtime was given ``on_commit``). A later commit with a smaller ``from_step``
    supersedes this one (a restart after a crash between the two writes).
    """

    from_step: int
    to_step: int
    samples_done: int
    ids: list[tuple[int, list[int]]] = field(default_factory=list)


@dataclass
class RunProgress:
    """Where a run is; a checkpoint's ``progress`` (``to_dict``, ``from_dict``)."""

    step: int = 0
    samples_done: int = 0
    resets: int = -1  # the first start is not a reset
    retunes: int = 0  # batch changes between resets
    batch_sizes: list[int] = field(default_factory=list)
    committed_step: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "samples_done": self.samples_done,
            "resets": self.resets,
            "retunes": self.retunes,
            "batch_sizes": list(self.batch_sizes),
            "committed_step": self.committed_step,
        }

    @classmethod
    def from_dict(cls, pr: dict[str, Any]) -> RunProgress:
        return cls(
            step=int(pr["step"]),
            samples_done=int(pr["samples_done"]),
            resets=int(pr["resets"]),
            retunes=int(pr.get("retunes", 0)),
            batch_sizes=[int(b) for b in pr["batch_sizes"]],
            committed_step=int(pr["committed_step"]),
        )


def default_fetch(dataset: Any) -> Callable[[np.ndarray], Any]:
    """Batch ``dataset[i]`` for the ids with torch's default collate."""
    from torch.utils.data import default_collate

    def fetch(ids: np.ndarray) -> Any:
        return default_collate([dataset[int(i)] for i in ids])

    return fetch


def finite_report(value: float, samples_done: int) -> float:
    """``runtime.report``'s value as a float; one line if it is not finite."""
    out = float(value)
    if not math.isfinite(out):
        raise RuntimeConfigError(
            f"runtime.report({out}) at {samples_done} samples: the value must be finite"
        )
    return out


def model_checksum(params: list[Any]) -> float:
    """The sum of the parameters' norms, equal on every replica unless they drifted: one
    kernel per group of tensors and one read of the device (not one per parameter)."""
    import torch

    with torch.no_grad():
        norms = torch._foreach_norm([q.detach() for q in params])
        return float(torch.stack([n.double() for n in norms]).sum())
