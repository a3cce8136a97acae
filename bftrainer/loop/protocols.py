"""The seams of the loop: what a policy, a source, a driver, an observer and a clock
must do.

Each is a small :class:`~typing.Protocol` (as Horovod's ``HostDiscovery``), so a new
backend is a new class that fits, never a branch in the loop. ``Settler``, ``Placer``,
``Executor``, ``Reader`` and ``Actor`` are optional extras that the loop looks for at
run time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from bftrainer.loop.records import (
    Decision,
    Demand,
    Input,
    LoopView,
    PolicyInputs,
    Polled,
    Progress,
    Step,
    TrainerState,
)


class Policy(Protocol):
    """Decides, from data the loop hands it, and nothing else: a pure function of its
    inputs (the same inputs give the same decision), so a replay or a test can run it
    on any inputs. Admission (which unfinished trainers take part) is its seam too."""

    @property
    def name(self) -> str: ...

    def admit(
        self, trainers: Iterable[TrainerState], limit: int, fair_by: str
    ) -> list[TrainerState]:
        """The at most ``limit`` unfinished ``trainers`` (arrival order) that take part,
        in arrival order (``fair_by``: trainer, user or account); pure."""
        ...

    def decide(self, inputs: PolicyInputs) -> Decision:
        """Node sets for ``inputs.trainers`` (admitted, arrival order) from
        ``inputs.pool``; pure."""
        ...


class Source(Protocol):
    def poll(self, now_s: float) -> Polled:
        """Inputs due by ``now_s``, each returned once. Called at every step, possibly
        before the ``next_s`` it gave (another source or the driver woke the loop)."""
        ...


@runtime_checkable
class Settler(Protocol):
    """A source that plans on the step's decision before the step ends (the daemon's
    hold plan). What it does to the pool comes back as inputs, applied in the same
    step: so no later step sees a node the source has already let go of."""

    def poll(self, now_s: float) -> Polled: ...

    def settle(self, now_s: float, decided: bool, demand: Demand) -> Sequence[Input]:
        """Plan after the decision (``decided``: one was made this step), for what the
        admitted trainers can use (``demand``: data from the loop, never a call back
        into it); the inputs that this causes (e.g. a :class:`PoolChange` of released
        free nodes)."""
        ...


@runtime_checkable
class Executor(Protocol):
    """A driver that runs workers on the nodes a source holds: it takes the source's
    word on how they are reached (``Polled.exec_plan``) as data from the loop, in the
    step that polled it, and never asks the source."""

    def use_exec_plan(self, plan: object) -> None:
        """How workers reach the pool's nodes from now on (acted on after the commit)."""
        ...


@runtime_checkable
class Reader(Protocol):
    """A source that asks something outside that may be slow to answer (a scheduler, an
    allocator): asked before the step's transaction opens, so that no write lock is held
    while it waits. Its ``poll``, inside the transaction, records what the read found."""

    def poll(self, now_s: float) -> Polled: ...

    def read(self, now_s: float, view: LoopView | None = None) -> None:
        """Ask now if a poll is due (``poll`` then uses the answer); else nothing. The
        loop hands ``view``, its trainers and pool (a centre agent reports them)."""
        ...


@runtime_checkable
class Actor(Protocol):
    """A part that acts on the world (starts trainers, submits holders) only after the
    step that decided it is committed. What an action learns (a new holder's job id, a
    supervisor's pid) is recorded in the part's next step. Every action is redone from
    the record by a restart that finds it not done, so each must be idempotent."""

    def act(self, now_s: float) -> None:
        """Carry out what this step decided, after its commit."""
        ...


class TrainerDriver(Protocol):
    """Acts on trainers. The loop owns ``TrainerState.nodes`` and the curves; the driver
    owns progress (``processed_samples``) and cost accounting, and returns costs."""

    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        """``trainers`` (those holding nodes) ran from the previous call's ``now_s`` to
        this one (the first call only sets the clock); their progress and reports."""
        ...

    def next_wakeup_s(self, trainers: Sequence[TrainerState], now_s: float) -> float:
        """When the driver next has something to report (a completion at current
        rates, a report timer); inf if nothing is expected."""
        ...

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        """Some of the trainer's nodes left without warning (already removed from
        ``trainer.nodes``); returns the samples it cost."""
        ...

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        """Move the trainer to ``nodes`` (no migration: a superset or subset; () stops
        it until it gets nodes again); returns the samples it cost."""
        ...

    def cancel(self, trainer: TrainerState) -> None:
        """Stop the trainer for good (it was cancelled; its nodes are already freed)."""
        ...


@runtime_checkable
class Placer(Protocol):
    """A driver that must see a decision whole before it is handed out one trainer at a
    time (the live driver: with shared nodes, the slot one trainer frees is the slot
    another is given, whichever of them comes first)."""

    def place(self, changes: Mapping[str, tuple[str, ...]]) -> None:
        """The new node sets of the trainers whose sets change, before ``rescale``."""
        ...


class Clock(Protocol):
    def now_s(self) -> float: ...

    def wait_until(self, t_s: float) -> float:
        """Return at ``t_s`` (or earlier if woken); the time then."""
        ...

    def wake(self) -> None:
        """Cut a wait short (thread- and signal-safe)."""
        ...


class Observer(Protocol):
    def interval(
        self, t0_s: float, t1_s: float, pool_nodes: int, processed_samples: float
    ) -> None: ...

    def step(self, step: Step) -> None: ...
