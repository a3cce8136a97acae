"""A worker's share of its node when trainers share nodes: its slot's GPUs and CPUs.

With S slots per node the daemon writes in ``exec.json`` the trainer's ``slots_per_node``
and, per host, its slot indices in the order it got them (``bftrainer/daemon/slot_book.py``). The
worker of local rank r on host h (``HOROVOD_LOCAL_RANK`` / ``LOCAL_RANK``) runs on slot
``slots[h][r]``: Horovod keeps a worker's local rank while its host stays and stops the
highest ranks when the host's slots shrink, torchrun restarts every worker at each
change, so that slot never moves under a running worker.

Before the user's script runs, :func:`pin` gives the process slot k's share:

- its CPUs: the CPUs this process may use when it starts (the node's, as the holder's
  job step sees them) split into S contiguous parts, part k (``os.sched_setaffinity``),
  and ``OMP_NUM_THREADS`` = their number (OpenMP reads it when torch loads; a worker
  forked from torchrun's agent has torch loaded, and gets ``torch.set_num_threads``);
- its GPUs, where the node has some: the visible ones (``CUDA_VISIBLE_DEVICES`` if the
  scheduler set it, else every ``/dev/nvidiaN``) split the same way, part k, as
  ``CUDA_VISIBLE_DEVICES``.

At S = 1 (no ``slots`` in ``exec.json``) nothing is changed.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bftrainer.trainers import channel

T = TypeVar("T")
_NO_GPU = frozenset({"", "NoDevFiles", "-1"})


def share(items: Sequence[T], slot: int, slots_per_node: int) -> list[T]:
    """Slot ``slot``'s part of ``items`` cut into ``slots_per_node`` contiguous parts of
    sizes as equal as can be; with fewer items than slots, slot k gets item k mod n."""
    n = len(items)
    if n == 0:
        return []
    if n < slots_per_node:
        return [items[slot % n]]
    return list(items[slot * n // slots_per_node : (slot + 1) * n // slots_per_node])


def node_gpus(env: Mapping[str, str], dev: Path = Path("/dev")) -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else the node's
    ``/dev/nvidiaN`` devices; [] on a node without GPUs."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() not in _NO_GPU]
    found = (re.fullmatch(r"nvidia(\d+)", p.name) for p in dev.glob("nvidia*"))
    return [str(i) for i in sorted(int(m.group(1)) for m in found if m)]


@dataclass(frozen=True)
class SlotPin:
    """What :func:`pin` gave this worker."""

    host: str
    slot: int
    slots_per_node: int
    cpus: tuple[int, ...]
    gpus: tuple[str, ...]

    def describe(self) -> str:
        gpus = ",".join(self.gpus) if self.gpus else "none"
        return (
            f"slot {self.slot} of {self.slots_per_node} on {self.host}: "
            f"CPUs {','.join(map(str, self.cpus))} (OMP_NUM_THREADS={len(self.cpus)}), "
            f"GPUs {gpus}"
        )


def worker_slot(config: Mapping[str, Any], env: Mapping[str, str]) -> tuple[str, int, int]:
    """(host, slot index, S) of this worker from ``exec.json``'s ``config``; raises
    ValueError naming what is missing."""
    host = env.get("BFTRAINER_HOST") or env.get("HOROVOD_HOSTNAME") or env.get("SLURMD_NODENAME")
    if not host:
        raise ValueError("no host name (BFTRAINER_HOST, HOROVOD_HOSTNAME, SLURMD_NODENAME)")
    rank_text = env.get("HOROVOD_LOCAL_RANK") or env.get("LOCAL_RANK") or "0"
    try:
        rank = int(rank_text)
    except ValueError:
        raise ValueError(f"local rank {rank_text!r} is not a number") from None
    slots = config["slots"].get(host)
    if not slots or rank >= len(slots):
        raise ValueError(f"exec.json gives {host} slots {slots}: none for local rank {rank}")
    return host, int(slots[rank]), int(config["slots_per_node"])


def pin(trainer_dir: Path, env: MutableMapping[str, str]) -> SlotPin | None:
    """Give this process its slot's CPUs and GPUs (see the module docstring); None when
    the trainer does not share nodes. Raises ValueError when it cannot tell its slot."""
    try:
        config = channel.read_exec(trainer_dir)
    except channel.ChannelError as e:
        raise ValueError(str(e)) from None
    if config is None or not config.get("slots"):
        return None
    host, slot, slots_per_node = worker_slot(config, env)
    allowed = sorted(os.sched_getaffinity(0))
    cpus = share(allowed, slot, slots_per_node)
    os.sched_setaffinity(0, cpus)
    env["OMP_NUM_THREADS"] = str(len(cpus))
    torch = sys.modules.get("torch")
    if torch is not None:  # forked from torchrun's agent: OpenMP read the variable already
        torch.set_num_threads(len(cpus))
    gpus = share(node_gpus(env), slot, slots_per_node)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return SlotPin(host, slot, slots_per_node, tuple(cpus), tuple(gpus))
