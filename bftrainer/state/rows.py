"""What the store holds, as frozen dataclasses, and which states may follow which.

Callers get rows, never SQLite's: a ``TrainerRow`` reads the same whichever schema
version wrote it. The allowed state moves live here, beside the rows they govern.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TRAINER_STATES = ("queued", "running", "waiting", "done", "failed", "cancelled")
TERMINAL_STATES = frozenset({"done", "failed", "cancelled"})
# Which trainer state may follow which. `waiting`: started once, holds no node now (its
# workers checkpointed and stopped) and resumes when nodes come back.
NEXT_STATES: dict[str, frozenset[str]] = {
    "queued": frozenset({"running", "waiting", "failed", "cancelled"}),
    "running": frozenset({"waiting", "done", "failed", "cancelled"}),
    "waiting": frozenset({"running", "done", "failed", "cancelled"}),
    "done": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}
BACKENDS = ("horovod", "torchrun")
# Seconds a grow / a shrink costs a trainer when the user does not say (the allocator's
# scale-up and scale-down costs), per backend: measured on 2 cores in
# ../shared/notes/elastic-backends.md and docs/benchmarks.md.
DEFAULT_RESCALE_S: dict[str, tuple[float, float]] = {
    "horovod": (15.0, 5.0),
    "torchrun": (20.0, 20.0),
}
HOLDER_STATES = ("pending", "running", "ended")
HOLDER_NEXT: dict[str, frozenset[str]] = {
    "pending": frozenset({"running", "ended"}),
    "running": frozenset({"ended"}),
    "ended": frozenset(),
}


@dataclass(frozen=True)
class TrainerRow:
    """One trainer: what was submitted, where it stands, what it last reported."""

    id: str
    script: str
    args: tuple[str, ...]
    backend: str
    n_min: int
    n_max: int
    work_samples: float  # math.inf: until the trainer's own stop (NULL in the store)
    rescale_up_s: float
    rescale_down_s: float
    state: str
    submit_s: float
    started_s: float | None
    finished_s: float | None
    cancel_requested: bool
    samples_done: int
    throughput_sps: float | None
    goodput_sps: float | None
    batch_size: int | None
    reason: str
    trainer_dir: str | None
    # The running supervisor's handle; None before the first start and while a restart
    # is pending (Store.decide_restart).
    supervisor: str | None
    # Times the daemon started the trainer's supervisor again after it died or gave up
    # for a reason other than the trainer's own script.
    restarts: int = 0
    # A search trial's promise: the rungs its pruner has passed it (bftrainer/hpo/; 0 for
    # any other trainer). The daemon weighs it with [daemon] search_promise.
    rungs: int = 0

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class AllocationRow:
    """The node set given to a trainer at ``time_s`` (empty: no node). With S slots per
    node (``--slots-per-node``) a node is listed once per slot, and ``slots`` says which
    slots of each node (0..S-1, in the order the trainer got them); empty at S = 1."""

    trainer_id: str
    nodes: tuple[str, ...]
    time_s: float
    slots: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class HolderRow:
    """One holder job keeping one node, and the trainer it serves (None: none yet)."""

    job_id: str
    node: str
    state: str
    submit_s: float
    started_s: float | None = None
    ended_s: float | None = None
    trainer_id: str | None = None
    reason: str = ""
    # The time limit asked for (None: none); the scheduler ends the holder this long
    # after it starts.
    limit_s: float | None = None

    @property
    def live(self) -> bool:
        return self.state != "ended"

    def ends_by_s(self, poll_interval_s: float = 0.0) -> float | None:
        """When the scheduler ends this holder at the latest (None: no limit, or not
        started). ``started_s`` is when the daemon saw it run, up to a poll after it
        did: ``poll_interval_s`` takes that back, so that the end is never late."""
        if self.limit_s is None or self.started_s is None:
            return None
        return self.started_s - poll_interval_s + self.limit_s


@dataclass(frozen=True)
class PoolEventRow:
    """A change of the pool as the daemon saw it; ``windows_s``: node -> seconds left
    (None: open-ended) for the nodes in the pool after the change."""

    id: int
    time_s: float
    joined: tuple[str, ...]
    left: tuple[str, ...]
    windows_s: dict[str, float | None]
    stale: bool


@dataclass(frozen=True)
class MetricRow:
    """One metrics record a trainer reported (``metrics.jsonl``'s ``record``)."""

    id: int
    trainer_id: str
    time_s: float
    record: dict[str, Any]


@dataclass(frozen=True)
class OrdersRow:
    """A step's orders as the daemon kept them (``record``: the order log's JSON,
    bftrainer/daemon/order_log.py); ``done_s``: when they were carried out (None: not
    known to be)."""

    step: int
    time_s: float
    record: str
    done_s: float | None


def trainer_id_of(seq: int) -> str:
    """``t0001``: short; zero-padded to 4 digits so ids sort by submission up to t9999
    (beyond, sort by ``(len(id), id)``, as ``Store.trainers`` does by sequence)."""
    return f"t{seq:04d}"


def check_states(states: Iterable[str], known: Sequence[str], what: str) -> None:
    """Refuse a state name that is not one of ``known`` (a typo would match no row)."""
    for s in states:
        if s not in known:
            raise ValueError(f"unknown {what} state {s!r}: expected one of {', '.join(known)}")
