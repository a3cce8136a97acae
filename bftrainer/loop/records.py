"""The loop's records: what flows through a step, as plain data.

A trainer's live record (:class:`TrainerState`), a policy's answer (:class:`Decision`),
the typed inputs a source or a driver hands the loop (:class:`PoolChange`,
:class:`Arrival`, :class:`CurveReport`, :class:`Completion`, :class:`Cancel`,
:class:`Redecide`), what a poll and an advance return (:class:`Polled`,
:class:`Progress`), and what the loop records and restores (:class:`Step`,
:class:`LoopState`), with the loop's two errors. They live apart from the loop so that
policies, drivers and sources import the data they exchange without importing the step
order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.loop.churn import Churn
from bftrainer.loop.jobs import JobSpec

Curve = tuple[tuple[float, float], ...]


class LoopError(ValueError):
    """The loop was given inputs or a state it cannot use; names the value."""


class LoopStalledError(RuntimeError):
    """The loop would spin: the clock cannot move and no input or decision comes."""


# ---- the trainers' records ---------------------------------------------------------------
@dataclass
class TrainerState:
    """One trainer's live record (mutable: the loop updates it in place, incrementally)."""

    job: JobSpec
    nodes: tuple[str, ...] = ()
    started_s: float | None = None
    finished_s: float | None = None
    cancelled_s: float | None = None
    processed_samples: float = 0.0
    rescale_cost_samples: float = 0.0
    preemption_cost_samples: float = 0.0
    rescales: int = 0
    # Curves the trainer reported from its own model, by metric ("throughput",
    # "goodput"): breakpoints (nodes, value/s). Policies prefer them to the job's profile.
    reported_curves: dict[str, Curve] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.job.id

    def curve(self, metric: str) -> Curve:
        """The latest curve for ``metric``; the job's throughput profile otherwise."""
        return self.reported_curves.get(metric, self.job.curve)

    @property
    def progress_samples(self) -> float:
        """Useful work: processed minus what rescales and preemptions lost."""
        return self.processed_samples - self.rescale_cost_samples - self.preemption_cost_samples


@dataclass(frozen=True)
class Decision:
    """A policy's answer: node sets for the admitted trainers, and how it was reached."""

    nodes: Mapping[str, tuple[str, ...]]
    status: str = "optimal"
    solve_s: float = 0.0
    t_fwd_s: float | None = None  # the look-ahead used, for a policy that has one
    # The nodes to hold for the trainers, for a policy that says (a centre agent's: all
    # the allocator assigned, their holders started or not); handed on in ``Demand``.
    hold: frozenset[str] = frozenset()


# ---- inputs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolChange:
    """Nodes joined and/or left the pool, without warning."""

    event: PoolEvent


@dataclass(frozen=True)
class Arrival:
    """A trainer was submitted; it queues, first come first served."""

    job: JobSpec


@dataclass(frozen=True)
class CurveReport:
    """A trainer's own model of ``metric`` ("throughput", "goodput") per node count."""

    trainer_id: str
    metric: str
    curve: Curve


@dataclass(frozen=True)
class Completion:
    """A trainer finished its work; its nodes return to the pool."""

    trainer_id: str


@dataclass(frozen=True)
class Cancel:
    """Stop a trainer (queued or running) for good; its nodes return to the pool."""

    trainer_id: str


@dataclass(frozen=True)
class Redecide:
    """Decide again: something the policy reads besides the loop's state changed (a
    centre agent's policy follows the allocator's last assignment)."""


@dataclass(frozen=True)
class Assignment:
    """The node sets to follow (a centre agent's: the allocator's last assignment, by
    trainer id); the loop keeps the latest and hands it to the policy, and decides again."""

    nodes: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class Refused:
    """Nodes a user could not hold (the centre's allocator): (user, node) -> until when
    (the loop's clock), the whole table as it is now; the loop keeps the latest, hands it
    to the policy, and decides again."""

    until_s: Mapping[tuple[str | None, str], float]


Input = PoolChange | Arrival | CurveReport | Completion | Cancel | Redecide | Assignment | Refused


@dataclass(frozen=True)
class PolicyInputs:
    """All that a policy reads, handed by the loop (a policy reads no clock, no shared
    table, no source): the pool, the admitted trainers (arrival order, with their nodes
    and reported curves), the pool's churn, the loop's time, and the inputs that came as
    data (:class:`Assignment`, :class:`Refused`). Equal inputs give an equal decision."""

    pool: tuple[str, ...]
    trainers: list[TrainerState]
    churn: Churn = field(default_factory=Churn)
    now_s: float = 0.0
    assignment: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    refused_until_s: Mapping[tuple[str | None, str], float] = field(default_factory=dict)

    def refused_to(self, user: str | None) -> frozenset[str]:
        """The nodes refused to ``user`` now."""
        return frozenset(
            n for (u, n), until in self.refused_until_s.items() if u == user and until > self.now_s
        )


@dataclass(frozen=True)
class Demand:
    """What the admitted trainers can use, handed to the loop's planner that holds nodes
    for them (the daemon's hold plan, ``Planner.plan``): ``nodes``, their n_max summed (with S
    slots per node, the nodes those slots fill), and ``allocated``, the nodes trainers
    hold now; ``hold``, what the last decision's policy asked to hold (``Decision.hold``)."""

    nodes: int
    allocated: frozenset[str]
    hold: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Planned:
    """A planner's answer: the nodes it releases (they leave the loop's pool in this same
    step) and its plan, as data for the step's :class:`Orders` (``Orders.hold``)."""

    released: frozenset[str] = frozenset()
    plan: object | None = None
    # How many pool nodes the planner could hold now (the daemon: the pool less the
    # nodes that wait after a failed holder or whose holder pends too long); None: it
    # holds no more than it is told (a centre agent). While the demand wants more nodes
    # than the loop's pool has and holdable ones remain, nodes are coming: the loop lets
    # a decision that takes nodes from a running trainer wait for them (held_wait.py).
    holdable: int | None = None


@dataclass(frozen=True)
class LoopView:
    """What a :class:`~bftrainer.loop.protocols.Reader` is handed when it asks outside at
    a step's start: the unfinished trainers (arrival order) and the pool. A source gets
    the loop's state as data; it never holds the loop."""

    trainers: tuple[TrainerState, ...]
    pool: frozenset[str]


@dataclass(frozen=True)
class Polled:
    """A source's answer: the inputs due by now, and when to poll it next (inf: only
    when something else wakes the loop). ``exec_plan``: a source that holds nodes says
    how workers reach them now (the daemon's holders); the loop puts it untouched in
    the step's :class:`Orders` and never reads it."""

    inputs: tuple[Input, ...] = ()
    next_s: float = math.inf
    exec_plan: object | None = None


@dataclass(frozen=True)
class Progress:
    """What ``TrainerDriver.advance`` saw: samples processed since the last call, and
    the trainers' reports (curves, completions) as inputs for the loop. A report may
    concern a trainer at zero nodes now (what it wrote while it ran, or its crash),
    never one the driver has not run or one cancelled. ``orders``: what the driver found
    due while advancing (a dead supervisor's leftovers to end, a restart come due), as
    data the loop puts in the step's :class:`Orders`, carried out after the commit."""

    processed_samples: float = 0.0
    reports: tuple[CurveReport | Completion, ...] = ()
    orders: tuple[object, ...] = ()


@dataclass(frozen=True)
class NodeChange:
    """One change of a trainer's nodes in a step, as the loop made it: ``why`` is
    "preempt" (nodes left the pool under it), "evict" (another trainer took its place
    in the admission), "decide" (the decision moved it) or "cancel" (stopped for good;
    ``nodes`` is then ())."""

    trainer_id: str
    nodes: tuple[str, ...]
    why: str
    before: int = 0  # the node count it had just before


@dataclass(frozen=True)
class Orders:
    """What one step decided, as one record: the trainers' node changes in the order the
    loop made them, the decision's changed node sets whole (``decided``: with shared
    nodes the slots one frees are another's), the trainers that start (``started``:
    first nodes ever), how workers reach the pool now (``exec_plan``, a source's word,
    None: unchanged), the hold plan (``hold``: a planner's, opaque to the loop) and the
    driver's own (``driver``: from ``Progress.orders``). Recorded in the step's
    transaction and carried out after its commit by the loop's
    :class:`~bftrainer.loop.protocols.Actuator`; a restart does again what was not done."""

    time_s: float
    changes: tuple[NodeChange, ...] = ()
    decided: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    exec_plan: object | None = None
    hold: object | None = None
    driver: tuple[object, ...] = ()

    def final_nodes(self) -> dict[str, tuple[str, ...]]:
        """Each changed trainer's node set at the step's end, in the order first changed."""
        out: dict[str, tuple[str, ...]] = {}
        for c in self.changes:
            out[c.trainer_id] = c.nodes
        return out

    @property
    def cancelled(self) -> tuple[str, ...]:
        return tuple(c.trainer_id for c in self.changes if c.why == "cancel")


# ---- records -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """What happened at one instant of the loop, for the per-event log and metrics."""

    time_s: float
    pool_nodes: int
    allocated_nodes: int
    running: int
    waiting: int
    joined: int
    left: int
    arrivals: int
    completions: int
    rescale_cost_samples: float
    preemption_cost_samples: float
    decided: bool
    status: str
    solve_s: float
    cancels: int = 0
    latency_s: float = 0.0  # inputs seen -> node sets handed to the driver (wall time)
    t_fwd_s: float | None = None  # the decision's look-ahead (milp policy), else None


@dataclass
class LoopState:
    """What the loop needs to go on: to start a replay, or to restore a daemon from its
    durable records. ``trainers``: unfinished, in arrival order, with their current
    nodes (all in ``pool``) and progress; ``finished``: completed or cancelled."""

    now_s: float
    pool: tuple[str, ...] = ()
    trainers: list[TrainerState] = field(default_factory=list)
    finished: list[TrainerState] = field(default_factory=list)
    last_decision_s: float = -math.inf

    def check(self, slots_per_node: int) -> None:
        """``LoopError`` naming the first trainer that cannot be restored as recorded:
        listed twice, on a node outside the pool, or on a node whose slots (S per node)
        its trainers overfill (S = 1: a node held by two)."""
        pool = set(self.pool)
        seen: set[str] = set()
        held: dict[str, str] = {}
        slots: dict[str, int] = {}  # with S slots per node, a node once per slot held
        for t in self.trainers:
            if t.id in seen:
                raise LoopError(f"trainer {t.id!r} appears twice in the state")
            seen.add(t.id)
            for n in t.nodes:
                if n not in pool:
                    raise LoopError(f"trainer {t.id!r} holds node {n!r}, not in the pool")
                slots[n] = slots.get(n, 0) + 1
                if slots[n] > slots_per_node:
                    if slots_per_node == 1:
                        raise LoopError(f"node {n!r} is held by both {held[n]!r} and {t.id!r}")
                    raise LoopError(
                        f"node {n!r} has {slots_per_node} slots; trainers up to "
                        f"{t.id!r} hold {slots[n]}"
                    )
                held[n] = t.id
