"""The held pool's orders and what carrying them out learns, as data.

A step's hold plan (``HeldPool.plan``) is a tuple of orders that travels in the step's
:class:`~bftrainer.loop.Orders` (``Orders.hold``); ``HeldPool.act`` carries them out after
the commit and returns what it learnt, which ``HeldPool.learn`` records at the next step.
"""

from __future__ import annotations

from dataclasses import dataclass

from bftrainer.holders.base import HolderStatus
from bftrainer.idle_monitor.source import PoolView


@dataclass(frozen=True)
class EndHolders:
    """Order: end these holders through the one cancel path, for ``reason``. ``kind``
    says why, which sets its log line and how it counts: "release" (no trainer needs
    the nodes), "stuck" (it cannot start before its node's claim), "requeued" (no longer
    ours: counted lost), "stray" (unknown or lingering: neither recorded nor counted),
    "unrecorded" (the store refused it: not recorded)."""

    job_ids: tuple[str, ...]
    reason: str
    kind: str
    now_s: float | None = None
    nodes: tuple[str, ...] = ()
    strays: tuple[tuple[str, HolderStatus], ...] = ()


@dataclass(frozen=True)
class Acquire:
    """Order: submit a holder for each of ``nodes``, limited by ``view``'s windows."""

    nodes: tuple[str, ...]
    view: PoolView
    now_s: float


HoldOrder = EndHolders | Acquire


@dataclass(frozen=True)
class Submitted:
    """Learnt: a holder was submitted for ``node`` (its job id, its time limit)."""

    job_id: str
    node: str
    limit_s: float | None
    now_s: float


@dataclass(frozen=True)
class Ended:
    """Learnt: our cancel ended these holders, for ``reason``."""

    job_ids: tuple[str, ...]
    reason: str
    now_s: float | None
