"""The seams of the loop: what a policy, a source, a driver, an observer and a clock
must do.

Each is a small :class:`~typing.Protocol` (as Horovod's ``HostDiscovery``), so a new
backend is a new class that fits, never a branch in the loop. ``Reader``, ``Planner`` and
``Actuator`` are parts the daemon adds; whoever builds a loop names them
(``Loop(readers=..., planner=..., actuator=...)``): the loop never asks a part what it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from bftrainer.loop.records import (
    Decision,
    Demand,
    LoopView,
    Orders,
    Planned,
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


class Reader(Protocol):
    """A part that asks something outside that may be slow to answer (a scheduler, an
    allocator): asked before the step's transaction opens, so that no write lock is held
    while it waits. Its ``poll`` (it is a source too), inside the transaction, records
    what the read found. The loop's builder names its readers (``Loop(readers=...)``)."""

    def read(self, now_s: float, view: LoopView | None = None) -> None:
        """Ask now if a poll is due (``poll`` then uses the answer); else nothing. The
        loop hands ``view``, its trainers and pool (a centre agent reports them)."""
        ...


class Planner(Protocol):
    """Plans on the step's decision before the step ends (the daemon's hold plan): what
    it releases leaves the pool in the same step, so no later step sees a node that is
    being let go of. It plans; it does not act (its plan is in the step's orders)."""

    def plan(self, now_s: float, decided: bool, demand: Demand) -> Planned:
        """Plan after the decision (``decided``: one was made this step), for what the
        admitted trainers can use (``demand``: data from the loop, never a call back
        into it)."""
        ...


class Actuator(Protocol):
    """Carries out a step's :class:`~bftrainer.loop.records.Orders` (the daemon's: the
    live driver and the held pool). The loop calls it at three points and nowhere else:
    ``learn`` and ``record`` inside the step's transaction (they write what is known and
    what was decided, and act on nothing), ``act`` after the commit. Every action is
    idempotent: a restart that finds an order recorded and not done does it again."""

    def learn(self, report: Sequence[object]) -> None:
        """Record what the last ``act`` learnt (a supervisor's pid, a start that
        failed), at the next step's start, in its transaction."""
        ...

    def record(self, orders: Orders) -> None:
        """Record the step's orders (the trainers' nodes and states), in its transaction."""
        ...

    def act(self, orders: Orders) -> Sequence[object]:
        """Carry the orders out, after the commit; what it learnt, for ``learn``."""
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

    # The three below are a simulated trainer's accounting: what a change costs (a
    # simulated driver moves its model of the trainer). A driver of real trainers acts
    # on none of them: its actions are the step's Orders, after the commit (Actuator).
    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        """Some of the trainer's nodes left without warning (already removed from
        ``trainer.nodes``); returns the samples it cost."""
        ...

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        """The trainer moves to ``nodes`` (no migration: a superset or subset; () stops
        it until it gets nodes again); returns the samples it cost."""
        ...

    def cancel(self, trainer: TrainerState) -> None:
        """The trainer stops for good (it was cancelled; its nodes are already freed)."""
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
