"""The loop itself: the step order, for the daemon (live) and the replay (offline).

One step, in this order: wait for the earliest of the sources' next poll, the driver's
wake-up, a rate-limited re-decision and ``until_s``; ``driver.advance`` to the clock's
time; poll every source; apply the inputs (the driver's reports first, then each
source's in order: completions and cancels free nodes, pool changes preempt holders of
leaving nodes and add joining ones in sorted order, arrivals queue, curve reports update
the trainers' curves); decide if a trainer came, went or the pool changed -- or if a
curve was reported and the last decision is ``redecide_every_s`` old (else a re-decision
is scheduled for then) -- and hand changed node sets to the driver (its accounting of
what a change costs); let the planner plan holders on the decision; record a
:class:`Step` only if an input (other than a curve report) arrived or a decision was
made. The loop raises :class:`LoopStalledError` instead of spinning when the clock
cannot move and nothing happens (e.g. a trace in epoch milliseconds, where a wake-up a
few microseconds ahead rounds to now).

**Nodes on their way** (the daemon): a decision that takes nodes from a running trainer
waits for the nodes the planner holds for the queue (``held_wait.py``).

**Decision latency** (``Step.latency_s``, logged at DEBUG): wall time from the moment
the step's inputs were seen (the sources returned them) to the moment the last changed
node set was handed to the driver (``driver.rescale`` returned).

**One step, one transaction** (the daemon; the replay passes none): the step waits
(outside), lets each of its ``readers`` ask its scheduler (outside: no lock is held
while a slow scheduler answers), then, inside ``transaction()``, has the actuator record
what the last step's actions learnt, advances, polls, applies, decides, plans, makes the
step's :class:`Orders` (the node changes, the decision's sets, the exec plan, the hold
plan, the driver's own), has the actuator record them and records the step; only after
the commit does the actuator carry the orders out. Inside the transaction the loop
calls no part that acts. A kill before the commit leaves nothing of the step; a kill
after it leaves a record that a restart carries out.

The loop is given its policy: it builds none. Whoever builds a loop (the replay, the
daemon, the centre, a test) builds the policy from the configuration with
``bftrainer.policies.registry.make_policy`` or passes its own.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.loop.churn import ChurnWindow
from bftrainer.loop.held_wait import HeldWait
from bftrainer.loop.jobs import JobSpec
from bftrainer.loop.protocols import (
    Actuator,
    Clock,
    Observer,
    Planner,
    Policy,
    Reader,
    Source,
    TrainerDriver,
)
from bftrainer.loop.records import (
    Arrival,
    Assignment,
    Cancel,
    Completion,
    CurveReport,
    Decision,
    Demand,
    Input,
    LoopError,
    LoopStalledError,
    LoopState,
    LoopView,
    NodeChange,
    Orders,
    PolicyInputs,
    PoolChange,
    Redecide,
    Refused,
    Step,
    TrainerState,
)
from bftrainer.loop.roster import Roster
from bftrainer.loop.sources import WINDOW_TOLERANCE_S

if TYPE_CHECKING:
    from bftrainer.policies.config import Config

log = logging.getLogger(__name__)

# Steps in a row at one instant with nothing recorded before the loop gives up.
MAX_STALLED_STEPS = 1000


class Loop:
    """The step order, for both modes; see the module docstring."""

    def __init__(
        self,
        sources: Sequence[Source],
        driver: TrainerDriver,
        clock: Clock,
        config: Config,
        *,
        policy: Policy,
        observer: Observer | None = None,
        state: LoopState | None = None,
        keep_finished: bool = True,
        transaction: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
        readers: Sequence[Reader] = (),
        planner: Planner | None = None,
        actuator: Actuator | None = None,
    ) -> None:
        self.sources = list(sources)
        # The daemon's parts, named by whoever builds the loop (never looked for): who
        # asks outside before the transaction, who plans holders on the decision, who
        # records and carries out the step's orders.
        self.readers = list(readers)
        self.planner = planner
        self.actuator = actuator
        # The daemon's store.transaction: a step's writes commit once, before it acts.
        self.transaction = transaction
        self.driver = driver
        self.clock = clock
        self.config = config
        self.policy = policy
        self.observer = observer
        state = state if state is not None else LoopState(now_s=clock.now_s())
        self.now_s = state.now_s
        self.pool: dict[str, None] = dict.fromkeys(state.pool)  # an ordered set
        self.roster = Roster(state.finished, keep_finished=keep_finished)
        self.trainers = self.roster.trainers  # unfinished, arrival order
        self.finished = self.roster.finished
        self.last_decision_s = state.last_decision_s
        state.check(config.slots_per_node)
        for t in state.trainers:
            self.roster.add(t)
        self._dirty = True  # the first step decides (after a restore too)
        self._curves_changed = False
        self._hold: frozenset[str] = frozenset()  # the last decision's (Decision.hold)
        self._held_wait = HeldWait()  # a decision put off for nodes being held
        self._stop = False
        self._started = False
        self._source_next_s = state.now_s  # poll every source at the first step
        self._stalled = 0
        self._pending: dict[str, float] = {}
        self._reports: list[Input] = []
        # The step's orders as the loop makes them (Orders), and what the last step's
        # actions learnt (the actuator's report, recorded at the next step's start).
        self._changes: list[NodeChange] = []
        self._decided: dict[str, tuple[str, ...]] = {}
        self._exec_plan: object | None = None
        self._hold_plan: object | None = None
        self._driver_orders: tuple[object, ...] = ()
        self._learnt: Sequence[object] = ()
        # The pool's churn, from the changes this loop applies (a restart watches anew).
        self.churn = ChurnWindow(start_s=state.now_s)
        # When the pool source said each node will be taken back (PoolEvent.windows_s).
        self.leave_by_s: dict[str, float] = {}
        # The policy's inputs that come as data (Assignment, Refused): the latest of each.
        self.assignment: dict[str, tuple[str, ...]] = {}
        self.refused_until_s: dict[tuple[str | None, str], float] = {}

    # ---- driving --------------------------------------------------------------------------
    def state(self) -> LoopState:
        """The loop's state now (the trainers are the live records, not copies)."""
        return LoopState(
            now_s=self.now_s,
            pool=tuple(self.pool),
            trainers=list(self.trainers.values()),
            finished=list(self.finished),
            last_decision_s=self.last_decision_s,
        )

    def flush(self) -> None:
        """Have the actuator record what the last step's actions learnt now, in the
        caller's transaction (at the daemon's exit: no next step will)."""
        if self.actuator is not None:
            learnt, self._learnt = self._learnt, ()
            self.actuator.learn(learnt)

    def request_stop(self) -> None:
        """Make ``run`` return after the current step (safe from a signal handler)."""
        self._stop = True
        self.clock.wake()

    def next_time_s(self, until_s: float = math.inf) -> float:
        """When the next step is due: a source's next poll, the driver's wake-up, a
        postponed re-decision, or ``until_s``."""
        t = min(self._source_next_s, until_s)
        if not self._started or self._dirty:
            return min(t, self.now_s)
        due_s = self._held_wait.due_s()  # the nodes join at a poll, or it decides then
        if due_s is not None:
            t = min(t, due_s)
        t = min(t, self.driver.next_wakeup_s(self.running(), self.now_s))
        if self._curves_changed:
            t = min(t, self.last_decision_s + self.config.redecide_every_s)
        return t

    def run(
        self,
        *,
        until_s: float = math.inf,
        stop: Callable[[Loop], bool] | None = None,
    ) -> Loop:
        """Step until ``until_s`` is reached, ``stop(loop)`` says so after a step, or
        ``request_stop()`` was called."""
        while not self._stop:
            self.step(until_s=until_s)
            if self.now_s >= until_s or (stop is not None and stop(self)):
                break
        return self

    def step(self, *, until_s: float = math.inf) -> Step | None:
        """One step (see the module docstring); the recorded Step, or None."""
        target = self.next_time_s(until_s)
        now = self.clock.wait_until(target)
        if now < self.now_s:  # a wall clock stepped back: keep the loop's time monotone
            log.warning("clock went back from %.3f to %.3f; keeping %.3f", self.now_s, now, now)
            now = self.now_s
        if self.readers:
            view = LoopView(tuple(self.trainers.values()), frozenset(self.pool))
            for reader in self.readers:
                reader.read(now, view)
        with self.transaction():
            step, orders = self._step_at(now, target)
        if self.actuator is not None:
            self._learnt = self.actuator.act(orders)
        return step

    def _step_at(self, now: float, target: float) -> tuple[Step | None, Orders]:
        """The step's writes, in the step's transaction: what the last actions learnt,
        advance, poll, apply, decide, plan, record; the step's orders."""
        moved = now > self.now_s or not self._started
        self._started = True
        if self.actuator is not None:
            learnt, self._learnt = self._learnt, ()
            self.actuator.learn(learnt)
        self._advance(now)
        inputs: list[Input] = []
        next_s = math.inf
        for source in self.sources:
            polled = source.poll(now)
            inputs.extend(polled.inputs)
            next_s = min(next_s, polled.next_s)
            if polled.exec_plan is not None:
                self._exec_plan = polled.exec_plan
        self._source_next_s = next_s
        seen = time.perf_counter()
        recorded = False
        for item in self._reports + inputs:
            recorded |= self._apply(item)
        self._reports = []
        decision = self._decide()
        latency = time.perf_counter() - seen if decision is not None else 0.0
        recorded |= self._plan(now, decision is not None)
        orders = self._orders(now)
        if self.actuator is not None:
            self.actuator.record(orders)
        if recorded or decision is not None:
            self._stalled = 0
            return self._record(decision, latency), orders
        self._pending = {}
        if moved:
            self._stalled = 0
        else:
            self._stalled += 1
            if self._stalled >= MAX_STALLED_STEPS:
                raise LoopStalledError(self._stall_message(target))
        return None, orders

    def _plan(self, now: float, decided: bool) -> bool:
        """Let the planner plan on the decision; the nodes it releases leave the pool
        now. A change to the pool leaves the loop dirty: the next step, due at once,
        decides again on the pool as it now is."""
        if self.planner is None:
            return False
        planned = self.planner.plan(now, decided, self.demand())
        self._hold_plan = planned.plan
        self._held_wait.holdable = planned.holdable
        if not planned.released:
            return False
        return self._apply(PoolChange(PoolEvent(now, left=planned.released)))

    def _orders(self, now: float) -> Orders:
        """The step's orders, as the loop made them; the next step's start afresh."""
        orders = Orders(
            now,
            tuple(self._changes),
            self._decided,
            self._exec_plan,
            self._hold_plan,
            self._driver_orders,
        )
        self._changes, self._decided, self._driver_orders = [], {}, ()
        self._exec_plan = self._hold_plan = None
        return orders

    def demand(self) -> Demand:
        """What the admitted trainers can use: their n_max summed (with S slots per
        node, in nodes: the slots packed), and the nodes trainers hold now."""
        slots = sum(t.job.n_max for t in self.admitted())
        allocated = frozenset(n for t in self.running() for n in t.nodes)
        return Demand(-(-slots // self.config.slots_per_node), allocated, self._hold)

    def running(self) -> list[TrainerState]:
        """The trainers that hold nodes, in arrival order (a new list each time)."""
        return self.roster.running()

    def admitted(self) -> list[TrainerState]:
        """The ``max_trainers`` unfinished trainers that take part, in arrival order, as
        the policy admits them (``Policy.admit``)."""
        return self.policy.admit(
            self.trainers.values(), self.config.max_trainers, self.config.fair_by
        )

    # ---- one step's parts -----------------------------------------------------------------
    def _advance(self, now: float) -> None:
        progress = self.driver.advance(self.running(), now)
        if now > self.now_s and self.observer:
            self.observer.interval(self.now_s, now, len(self.pool), progress.processed_samples)
        self.now_s = now
        self._reports = list(progress.reports)
        self._driver_orders = progress.orders

    def _apply(self, item: Input) -> bool:
        """Apply one input; True if it is an event to record (curve reports are not)."""
        match item:
            case PoolChange():
                return self._pool_change(item.event)
            case Arrival():
                self._arrive(item.job)
            case Completion():
                t = self._retire(item.trainer_id, "completion")
                if t is None:
                    return False
                t.finished_s = self.now_s
                self._add("completions", 1)
            case Cancel():
                held = (
                    len(self.trainers[item.trainer_id].nodes)
                    if item.trainer_id in self.trainers
                    else 0
                )
                t = self._retire(item.trainer_id, "cancel")
                if t is None:
                    return False
                self._changes.append(NodeChange(t.id, (), "cancel", held))
                t.cancelled_s = self.now_s
                self.driver.cancel(t)
                self._add("cancels", 1)
            case Redecide():
                self._dirty = True
                return False
            case Assignment():
                self.assignment = dict(item.nodes)
                self._dirty = True
                return False
            case Refused():
                self.refused_until_s = dict(item.until_s)
                self._dirty = True
                return False
            case CurveReport():
                t = self.trainers.get(item.trainer_id)
                if t is None:
                    log.warning("curve report for unknown trainer %r ignored", item.trainer_id)
                    return False
                t.reported_curves[item.metric] = item.curve
                self._curves_changed = True
                return False
            case _:
                raise LoopError(f"not a loop input: {item!r}")
        return True

    def _pool_change(self, event: PoolEvent) -> bool:
        """Apply a pool change; True unless it only restated known windows."""
        left = event.left
        if left:
            for t in self.running():
                if any(n in left for n in t.nodes):
                    old = len(t.nodes)
                    self.roster.set_nodes(t, tuple(n for n in t.nodes if n not in left))
                    self._changes.append(NodeChange(t.id, t.nodes, "preempt", old))
                    self._add("preemption", self.driver.preempt(t, old))
            for n in left:
                self.pool.pop(n, None)
                self.leave_by_s.pop(n, None)
        # Sorted, not set order: the pool's order decides which nodes a policy maps, so
        # a replay must not depend on PYTHONHASHSEED.
        for n in sorted(event.joined):
            self.pool[n] = None
        news = bool(left or event.joined) or not event.windows_s  # as before windows
        for n, w in event.windows_s.items():
            if n not in self.pool:
                continue
            was = self.leave_by_s.pop(n, None)
            if w is not None:
                self.leave_by_s[n] = self.now_s + w
            now = self.leave_by_s.get(n)
            if (was is None) != (now is None) or (
                was is not None and now is not None and abs(now - was) >= WINDOW_TOLERANCE_S
            ):
                news = True
        if not news:
            return False
        self._add("joined", len(event.joined))
        self._add("left", len(left))
        if left or event.joined:
            self.churn.observe(self.now_s)
        self._dirty = True
        return True

    def _arrive(self, job: JobSpec) -> None:
        self.roster.add(TrainerState(job))
        if len(self.trainers) <= self.config.max_trainers or (
            self.config.fair_by != "trainer" and any(t.id == job.id for t in self.admitted())
        ):
            self._dirty = True  # it is admitted at once
        self._add("arrivals", 1)

    def _retire(self, trainer_id: str, why: str) -> TrainerState | None:
        t = self.roster.retire(trainer_id)
        if t is None:
            log.warning("%s of unknown or finished trainer %r ignored", why, trainer_id)
            return None
        self._dirty = True
        log.debug("trainer %s retired (%s) at %.0f", trainer_id, why, self.now_s)
        return t

    def _decide(self) -> Decision | None:
        """Ask the policy when anything changed (or curves did, rate-limited), and
        hand changed node sets to the driver."""
        redecide = (
            self._curves_changed
            and self.now_s >= self.last_decision_s + self.config.redecide_every_s
        )
        waiting = self._held_wait.since_s is not None
        if not (self._dirty or redecide or waiting):
            return None
        admitted = self.admitted()
        # A trainer that another user's newcomer took the place of (fair_by user or
        # account) gives its nodes back before the policy hands them out.
        taking_part = {t.id for t in admitted}
        for t in self.running():
            if t.id not in taking_part:
                self._changes.append(NodeChange(t.id, (), "evict", len(t.nodes)))
                self._add("rescale", self.driver.rescale(t, ()))
                self.roster.set_nodes(t, ())
        churn = self.churn.snapshot(self.now_s)
        if self.leave_by_s:  # known departures still ahead (a passed one is no knowledge)
            windows = {n: t - self.now_s for n, t in self.leave_by_s.items() if t > self.now_s}
            churn = replace(churn, windows_s=windows)
        inputs = PolicyInputs(
            tuple(self.pool), admitted, churn, self.now_s, self.assignment, self.refused_until_s
        )
        decision = self.policy.decide(inputs) if admitted else Decision({})
        if self._held_wait.holdable is not None and self._held_wait.waits(
            self.now_s,
            self.demand().nodes,  # not for a replay: admitted() of a year's queue again
            len(self.pool),
            admitted,
            decision.nodes,
            evicted=any(c.why == "evict" for c in self._changes),
        ):
            self._dirty = False
            return None
        changes = {t.id: decision.nodes.get(t.id, ()) for t in admitted}
        self._decided = {i: n for i, n in changes.items() if n != self.trainers[i].nodes}
        for t in admitted:
            new = decision.nodes.get(t.id, ())
            if new != t.nodes:
                self._changes.append(NodeChange(t.id, new, "decide", len(t.nodes)))
                self._add("rescale", self.driver.rescale(t, new))
                if new and t.started_s is None:
                    t.started_s = self.now_s
                self.roster.set_nodes(t, new)
        self._dirty = False
        self._curves_changed = False
        self.last_decision_s = self.now_s
        self._hold = decision.hold
        return decision

    # ---- bookkeeping ----------------------------------------------------------------------
    def _add(self, key: str, value: float) -> None:
        self._pending[key] = self._pending.get(key, 0.0) + value

    def _record(self, decision: Decision | None, latency_s: float) -> Step:
        p = self._pending
        running = self.roster.holding
        step = Step(
            time_s=self.now_s,
            pool_nodes=len(self.pool),
            # Nodes holding a slot at least (with S = 1 every held node once: no node has
            # two holders, so the count kept is that number, without a set of them).
            allocated_nodes=self.roster.held
            if self.config.slots_per_node == 1
            else len(self.roster.held_nodes()),
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
            cancels=int(p.get("cancels", 0)),
            latency_s=latency_s,
            t_fwd_s=decision.t_fwd_s if decision else None,
        )
        self._pending = {}
        if decision is not None:
            log.debug(
                "decision at %.3f: %d admitted, pool %d, %s, latency %.1f ms (solve %.1f ms)",
                self.now_s,
                min(len(self.trainers), self.config.max_trainers),
                len(self.pool),
                decision.status,
                1e3 * latency_s,
                1e3 * decision.solve_s,
            )
        if self.observer:
            self.observer.step(step)
        return step

    def _stall_message(self, target_s: float) -> str:
        hint = ""
        if abs(self.now_s) > 1e11:
            hint = (
                f" (times of this size, {self.now_s:.6g}, look like epoch milliseconds: the "
                "clock cannot represent a step of microseconds there)"
            )
        return (
            f"the loop made no progress in {MAX_STALLED_STEPS} steps at time {self.now_s!r}: "
            f"the next step was due at {target_s!r} and nothing arrived or was decided{hint}"
        )


def run(
    sources: Sequence[Source],
    driver: TrainerDriver,
    clock: Clock,
    config: Config,
    *,
    policy: Policy,
    observer: Observer | None = None,
    state: LoopState | None = None,
    until_s: float = math.inf,
    stop: Callable[[Loop], bool] | None = None,
) -> Loop:
    """Build a :class:`Loop` and run it (see ``Loop.run``); returns the loop."""
    loop = Loop(sources, driver, clock, config, policy=policy, observer=observer, state=state)
    return loop.run(until_s=until_s, stop=stop)
