"""The live driver's own orders and what its actions learn, as data.

A step's :class:`~bftrainer.loop.Orders` carry the driver's orders (``Orders.driver``:
what ``LiveDriver.advance`` found due) next to the loop's; ``LiveDriver.act`` returns what
it learnt, which ``LiveDriver.learn`` records at the next step (bftrainer/daemon/live_driver.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bftrainer.trainers.launch.base import Launcher


@dataclass(frozen=True)
class EndLeftovers:
    """Order: end what a dead supervisor left running here (its workers)."""

    launcher: Launcher


@dataclass(frozen=True)
class StartAgain:
    """Order: start the trainer's supervisor again, from its checkpoint (its restart
    came due), on its nodes at the step's end."""

    trainer_id: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Stop:
    """Order: stop the trainer's supervisor (cancelled; a restart finds it running)."""

    trainer_id: str
    launcher: Launcher


@dataclass(frozen=True)
class Launched:
    """Learnt: the trainer's supervisor runs, with this pid."""

    trainer_id: str
    trainer_dir: Path
    pid: str


@dataclass(frozen=True)
class StartFailed:
    """Learnt: a start failed; ``again``: by the file system (started again, bounded),
    else by the trainer or its launch (it fails)."""

    trainer_id: str
    why: str
    again: bool
