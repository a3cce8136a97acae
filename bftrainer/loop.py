"""The core loop: one implementation for the daemon (live) and the replay (offline).

It keeps the pool and the trainers, and on every pool event, trainer arrival or
completion asks a :class:`Policy` for node sets and hands them to a :class:`TrainerDriver`.
Only the caller differs between modes: the replay feeds trace events on a virtual clock
(``bftrainer.replay.run``) and a simulated driver; the daemon feeds live pool events on
the wall clock and a driver that rescales real elastic jobs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.jobs import JobSpec

log = logging.getLogger(__name__)


@dataclass
class TrainerState:
    """One trainer's live record (mutable: the loop updates it in place, incrementally)."""

    job: JobSpec
    nodes: tuple[str, ...] = ()
    started_s: float | None = None
    finished_s: float | None = None
    processed_samples: float = 0.0
    rescale_cost_samples: float = 0.0
    preemption_cost_samples: float = 0.0
    rescales: int = 0
    # Curves the trainer reported from its own model, by metric ("throughput",
    # "goodput"): breakpoints (nodes, value/s). Policies prefer them to the job's profile.
    reported_curves: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.job.id

    def curve(self, metric: str) -> tuple[tuple[float, float], ...]:
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


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def decide(self, pool: tuple[str, ...], trainers: list[TrainerState]) -> Decision:
        """Node sets for ``trainers`` (admitted, arrival order) from ``pool``; pure."""
        ...


class TrainerDriver(Protocol):
    """Acts on trainers. Each method returns the samples it cost or processed."""

    def advance(self, trainers: Iterable[TrainerState], dt_s: float) -> float:
        """Progress of the running trainers over ``dt_s``; returns samples processed."""
        ...

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        """Some of the trainer's nodes left without warning (already removed)."""
        ...

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        """Move the trainer to ``nodes`` (no migration: a superset or subset)."""
        ...

    def is_done(self, trainer: TrainerState) -> bool: ...

    def next_completion_s(self, trainers: Iterable[TrainerState], now_s: float) -> float:
        """When the next running trainer completes at current rates (inf if none)."""
        ...


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


class Observer(Protocol):
    def interval(
        self, t0_s: float, t1_s: float, pool_nodes: int, processed_samples: float
    ) -> None: ...

    def step(self, step: Step) -> None: ...


@dataclass
class CoreLoop:
    policy: Policy
    driver: TrainerDriver
    now_s: float
    pool: dict[str, None] = field(default_factory=dict)  # an ordered set
    max_trainers: int = 10
    observer: Observer | None = None
    trainers: dict[str, TrainerState] = field(default_factory=dict)  # unfinished, arrival order
    finished: list[TrainerState] = field(default_factory=list)
    _dirty: bool = True
    _pending: dict[str, float] = field(default_factory=dict)

    # ---- inputs -------------------------------------------------------------------------
    def advance(self, t_s: float) -> None:
        """Let time pass to ``t_s``: running trainers progress at their current rates."""
        if t_s < self.now_s:
            raise ValueError(f"time going backwards: {t_s} < {self.now_s}")
        if t_s == self.now_s:
            return
        running = [t for t in self.trainers.values() if t.nodes]
        processed = self.driver.advance(running, t_s - self.now_s)
        if self.observer:
            self.observer.interval(self.now_s, t_s, len(self.pool), processed)
        self.now_s = t_s

    def pool_event(self, event: PoolEvent) -> None:
        """Nodes joined and/or left, without warning: holders of leaving nodes are cut."""
        left = event.left
        if left:
            for t in self.trainers.values():
                if any(n in left for n in t.nodes):
                    old = len(t.nodes)
                    t.nodes = tuple(n for n in t.nodes if n not in left)
                    self._add("preemption", self.driver.preempt(t, old))
            for n in left:
                self.pool.pop(n, None)
        for n in event.joined:
            self.pool[n] = None
        self._add("joined", len(event.joined))
        self._add("left", len(left))
        self._dirty = True

    def arrive(self, job: JobSpec) -> None:
        if job.id in self.trainers or any(t.id == job.id for t in self.finished):
            raise ValueError(f"trainer {job.id!r} arrived twice")
        if len(self.trainers) < self.max_trainers:
            self._dirty = True  # it is admitted at once
        self.trainers[job.id] = TrainerState(job)
        self._add("arrivals", 1)

    def complete_finished(self) -> list[TrainerState]:
        """Retire every trainer whose work is done; their nodes return to the pool."""
        done = [t for t in self.trainers.values() if self.driver.is_done(t)]
        for t in done:
            t.finished_s = self.now_s
            t.nodes = ()
            del self.trainers[t.id]
            self.finished.append(t)
            log.debug("trainer %s finished at %.0f", t.id, self.now_s)
        if done:
            self._dirty = True
            self._add("completions", len(done))
        return done

    # ---- decision -----------------------------------------------------------------------
    def admitted(self) -> list[TrainerState]:
        """First come, first served: the first ``max_trainers`` unfinished trainers."""
        out: list[TrainerState] = []
        for t in self.trainers.values():
            if len(out) == self.max_trainers:
                break
            out.append(t)
        return out

    def decide(self) -> Decision | None:
        """Ask the policy when anything changed, apply its node sets, record the step."""
        decision = None
        if self._dirty:
            admitted = self.admitted()
            decision = self.policy.decide(tuple(self.pool), admitted) if admitted else Decision({})
            for t in admitted:
                new = decision.nodes.get(t.id, ())
                if new != t.nodes:
                    self._add("rescale", self.driver.rescale(t, new))
                    if new and t.started_s is None:
                        t.started_s = self.now_s
                    t.nodes = new
            self._dirty = False
        self._record(decision)
        return decision

    def next_completion_s(self) -> float:
        return self.driver.next_completion_s(
            (t for t in self.trainers.values() if t.nodes), self.now_s
        )

    # ---- bookkeeping --------------------------------------------------------------------
    def _add(self, key: str, value: float) -> None:
        self._pending[key] = self._pending.get(key, 0.0) + value

    def _record(self, decision: Decision | None) -> None:
        p = self._pending
        if self.observer:
            running = sum(1 for t in self.trainers.values() if t.nodes)
            self.observer.step(
                Step(
                    time_s=self.now_s,
                    pool_nodes=len(self.pool),
                    allocated_nodes=sum(len(t.nodes) for t in self.trainers.values()),
                    running=running,
                    waiting=len(self.trainers) - running,
                    joined=int(p.get("joined", 0)),
                    left=int(p.get("left", 0)),
                    arrivals=int(p.get("arrivals", 0)),
                    completions=int(p.get("completions", 0)),
                    rescale_cost_samples=p.get("rescale", 0.0),
                    preemption_cost_samples=p.get("preemption", 0.0),
                    decided=decision is not None,
                    status=decision.status if decision else "",
                    solve_s=decision.solve_s if decision else 0.0,
                )
            )
        self._pending = {}
