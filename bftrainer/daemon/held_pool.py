"""The daemon's pool source: the nodes whose holder job runs, and the holders' record.

:class:`HeldPool` plugs into :class:`bftrainer.loop.Loop` as its pool. Every
``poll_interval_s`` it reads the main scheduler's pool (idle nodes nobody planned for,
with their windows) and the state of our holder jobs in one status call, and tells the
loop which nodes became usable (a holder runs) or were lost (a holder ended: preempted by
the main scheduler, or released). On the step's decision (:meth:`HeldPool.plan`) it
plans which holders to submit and cancel (:mod:`bftrainer.daemon.hold_plan`: only what the
admitted trainers can use, the loop's ``Demand``). The loop only ever sees nodes we hold.

It never waits on the scheduler inside the step's transaction: :meth:`HeldPool.read` asks
before it opens, :meth:`HeldPool.poll` records what was read, :meth:`HeldPool.plan`
plans (its orders as data, daemon/hold_orders.py, in the step's ``Orders.hold``), and
:meth:`HeldPool.act` carries them out after the commit. What that learns (a new holder's
job id, a cancel done) comes back as data, recorded by :meth:`HeldPool.learn` at the next
step's start; the read before it counts the holders just submitted as ours. A daemon
killed in between loses nothing: its restart ends holders the store does not know, drops
those that ended, and plans again.

It also keeps the holder view the rest of the daemon reads: each holder's state in the
store (written before anything acts on it), the leases that end holders by themselves
when the daemon is gone, the counts the metrics read, and the pool as ``bftrainer
status`` shows it. A holder that fails to hold its node is named with its cause, and its
node waits longer before each next try (holders/failures.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from bftrainer.daemon.exec_plan import ExecPlan
from bftrainer.daemon.gpu_slots import GpuSlotGate
from bftrainer.daemon.hold_orders import Acquire, Ended, EndHolders, HoldOrder, Submitted
from bftrainer.daemon.hold_plan import plan_assigned, plan_holders
from bftrainer.daemon.holder_records import HolderRecords, HoldersRead
from bftrainer.daemon.left_running import holding
from bftrainer.daemon.pool_status import publish_pool
from bftrainer.holders.base import HolderError, Holders, WindowTooShortError
from bftrainer.holders.failures import HolderBackoff
from bftrainer.idle_monitor.runner import CommandError
from bftrainer.idle_monitor.source import LivePoolSource, PoolView
from bftrainer.loop import WAIT_FOR_HELD_S, Demand, LoopView, Planned, Polled, PoolChange
from bftrainer.service.pool_changes import PoolChanges
from bftrainer.service.reading import HoldCounts
from bftrainer.state import HolderConflictError, HolderRow, Store
from bftrainer.trainers.channel import renew_lease

log = logging.getLogger(__name__)

# A held node that no trainer needs any more is released this many polls after it became
# spare, not at once (hold_plan.py says why): 3 s on the tests' 1 s poll, 30 s at the
# default 10 s. Holding it costs the centre nothing: a main job preempts it as any other.
SPARE_KEPT_POLLS = 3


class HeldPool:
    """The loop's pool: nodes whose holder runs (see the module docstring)."""

    def __init__(
        self,
        monitor: LivePoolSource,
        holders: Holders,
        store: Store,
        poll_interval_s: float,
        usable: Sequence[str] = (),
        *,
        lease_dir: Path | None = None,
        lease_s: float = 300.0,
        follow_assignment: bool = False,
    ) -> None:
        self.monitor = monitor
        self.holders = holders
        self.store = store
        # A centre agent holds exactly the nodes the allocator gave its trainers (the
        # decision's ``hold``, hold_plan.plan_assigned); else the demand's hold plan.
        self.follow_assignment = follow_assignment
        self._loop_view: LoopView | None = None  # the step's, for the GPU check
        self.poll_interval_s = poll_interval_s
        # The nodes whose holder runs, as the loop knows them, and the departures told.
        self.changes = PoolChanges(usable)
        # Each holder watches a lease file (scripts/slurm/hold-nodes.sbatch): renewed at
        # every poll, so holders end by themselves within lease_s of the daemon's end
        # unless a trainer's supervisor renews them. None: no leases (time limits only).
        self.lease_dir = lease_dir
        self.lease_s = lease_s
        self._lease_until: dict[str, float] = {}
        self._next_s = -math.inf
        self._view: PoolView | None = None  # the last poll's
        self._replan = False  # polled since the last hold plan
        self.counts = HoldCounts()
        # Nodes whose last holder failed wait before the next (holders/failures.py).
        self.backoff = HolderBackoff(2 * poll_interval_s)
        # --slots-per-node gres: nodes whose GPU count is not S stay out (set at start).
        self.gate: GpuSlotGate | None = None
        self._left_out: dict[str, str] = {}  # node -> why, as the gate last said
        self._idle: frozenset[str] = frozenset()  # the pool before the gate, for status
        self._polled_now = False  # read() asked the scheduler at this step
        self._read: HoldersRead | None = None  # what it found (None: holders not read)
        # This step's orders as it makes them (a requeued holder or strays found by
        # the poll's record, a refused one by learn, the plan's own): handed out whole
        # by plan() into the step's Orders, carried out by act() after the commit.
        self._staged: list[HoldOrder] = []
        # Holders submitted and not recorded yet (job id -> node): ours, at the next read.
        self._submitted: dict[str, str] = {}
        self._spare_since: dict[str, float] = {}  # held pool node no trainer uses -> since
        # Planned.holdable, as the last plan found it (None: a centre agent, or no plan
        # yet); between polls it stands, as the pool and the holders it counts do.
        self._holdable: int | None = None
        self.records = HolderRecords(holders, store, self.counts, self.backoff, self._lease_until)

    @property
    def usable(self) -> set[str]:
        """The nodes whose holder runs: the loop's pool."""
        return self.changes.known

    @usable.setter
    def usable(self, nodes: set[str]) -> None:
        self.changes.known = set(nodes)

    @property
    def view(self) -> PoolView | None:
        """The pool as the last poll read it (None before the first)."""
        return self._view

    def jobs(self) -> dict[str, str]:
        """node -> the job id of its live holder."""
        return {h.node: h.job_id for h in self.store.holders(live_only=True)}

    def exec_plan(self) -> ExecPlan:
        """How workers reach the held nodes now, handed to the driver with each poll:
        each node's live holder and its lease."""
        jobs = self.jobs()
        # Slurm: workers run as steps inside the holders. LSF: over ssh (blaunch is not wired).
        mode = "slurm" if self.holders.scheduler == "slurm" else "ssh"
        leases = {} if self.lease_dir is None else {n: str(self._lease(n)) for n in jobs}
        return ExecPlan(mode, jobs, leases=leases, lease_s=self.lease_s)

    def _lease(self, node: str) -> Path:
        assert self.lease_dir is not None
        return self.lease_dir / node

    def _renew_leases(self, nodes: Iterable[str], now_s: float, *, force: bool = False) -> None:
        """Renew the leases of ``nodes`` that are past half their time (or all: force)."""
        if self.lease_dir is None:
            return
        due = [
            n
            for n in nodes
            if force or self._lease_until.get(n, -math.inf) - now_s <= self.lease_s / 2
        ]
        if due:
            try:
                self.lease_dir.mkdir(mode=0o700, exist_ok=True)  # once, not per node
            except OSError as exc:
                log.error("cannot create the lease folder %s: %s", self.lease_dir, exc)
                return
        for node in due:
            try:
                renew_lease(self._lease(node), now_s + self.lease_s)
            except OSError as exc:
                log.error("cannot renew the lease of %s's holder: %s", node, exc)
                continue
            self._lease_until[node] = now_s + self.lease_s

    def read(self, now_s: float, view: LoopView | None = None) -> None:
        """Ask the scheduler, when a poll is due: the pool, and our holders' states
        (one status call, and the cause of each holder that failed). Nothing is
        recorded here: :meth:`poll` does, inside the step's transaction. ``view``: the
        loop's trainers, for the GPU check (which trainers a node's change affects)."""
        self._polled_now = False
        if view is not None:
            self._loop_view = view
        if now_s < self._next_s:
            return
        self._next_s = now_s + self.poll_interval_s
        self._replan = True
        self._polled_now = True
        try:
            self.monitor.poll()  # keeps the last good pool (stale) on a bad reply
        except (CommandError, ValueError) as exc:
            self.counts.errors["pool"] += 1
            log.warning("pool not read, keeping the last good one: %s", exc)
        try:
            self._read = self.records.read(self._submitted)
        except (HolderError, CommandError) as exc:
            self.counts.errors["holder_status"] += 1
            log.warning("holders not read, keeping the last known: %s", exc)
            self._read = None

    def poll(self, now_s: float) -> Polled:
        """Record what :meth:`read` found: the nodes whose holder started or ended since
        the last poll, and when each held node leaves. Holders are planned in
        :meth:`plan`, on the step's decision."""
        polled = self._poll(now_s)
        # Every step, not only a polling one: a holder submitted by the last step's
        # act() is recorded by learn() at this step's start.
        return replace(polled, exec_plan=self.exec_plan())

    def _poll(self, now_s: float) -> Polled:
        if not self._polled_now:
            return Polled((), self._next_s)
        self._polled_now = False
        read, self._read = self._read, None
        if read is None:
            return Polled((), self._next_s)
        self._staged += self.records.record(read, now_s)
        live = self.store.holders(live_only=True)
        self._renew_leases((h.node for h in live), now_s)
        running = {h.node: h for h in live if h.state == "running"}
        view = self.monitor.view()  # one view per poll: plan and event agree
        if self.gate is not None:
            # A held node whose GPU count is not S leaves the loop's pool (its holder is
            # then released by the plan: outside the pool, no trainer on it).
            users: dict[str, set[str]] = {n: set() for n in running}
            for t in self._loop_view.trainers if self._loop_view is not None else ():
                for n in t.nodes:
                    if n in users:
                        users[n].add(t.id)
            self._left_out = self.gate.misfits(view, users)
            self._idle = view.pool
            view = self.gate.without(view, set(self._left_out))
            running = {n: h for n, h in running.items() if n not in self._left_out}
        self._view = view
        leave_by = leave_by_s(view.claims_s, running.values(), now_s, self.poll_interval_s)
        event = self.changes.diff(running, leave_by, now_s)
        if event is None:
            return Polled((), self._next_s)
        if not event.empty:
            self.store.add_pool_event(
                joined=event.joined,
                left=event.left,
                windows_s=dict(view.windows_s),
                stale=view.stale,
                now_s=now_s,
            )
        return Polled((PoolChange(event),), self._next_s)

    def plan(self, now_s: float, decided: bool, demand: Demand) -> Planned:
        """Plan the holders the decision needs: after a poll or a decision, which to
        submit and cancel (:meth:`act` does it after the commit). Only nodes the
        decision left free are released, and they leave the loop's pool in this same
        step (``Planned.released``), so the loop never hands a trainer a node whose
        holder is being cancelled. The plan (``Planned.plan``) is this step's orders, as
        data: every one made since the last plan."""
        if not (self._replan or decided) or self._view is None:
            return Planned(plan=self._take(), holdable=self._holdable)
        self._replan = False
        released = self._plan(self._view, demand, now_s) & self.usable
        self.changes.forget(released)
        self._publish(self._view, self.changes.told, now_s)
        if released:
            self.store.add_pool_event(
                joined=(), left=released, windows_s={}, stale=self._view.stale, now_s=now_s
            )
        return Planned(frozenset(released), self._take(), self._holdable)

    def _take(self) -> tuple[HoldOrder, ...]:
        staged, self._staged = tuple(self._staged), []
        return staged

    def act(self, hold: object) -> list[Submitted | Ended]:
        """Carry out a step's hold orders (``Orders.hold``, after its commit); what it
        learnt, for :meth:`learn`. No reply ends the daemon: each failure is counted and
        logged where it arises, and the next poll plans again."""
        learnt: list[Submitted | Ended] = []
        for order in hold if isinstance(hold, tuple) else ():
            try:
                if isinstance(order, Acquire):
                    self._acquire(order.nodes, order.view, order.now_s, learnt)
                elif isinstance(order, EndHolders):
                    self._end(order, learnt)
            except (HolderError, CommandError) as exc:
                self.counts.errors["holder_submit"] += 1
                log.warning("holders not submitted, trying again at a later poll: %s", exc)
        return learnt

    def learn(self, learnt: Sequence[object]) -> None:
        """Record what the last :meth:`act` learnt (at the next step's start, in its
        transaction): new holders (one the store refuses is ordered ended) and ended
        ones."""
        for fact in learnt:
            if isinstance(fact, Submitted):
                self._record_holder(fact.job_id, fact.node, fact.limit_s, fact.now_s)
            elif isinstance(fact, Ended):
                self._record_ended(fact.job_ids, fact.reason, fact.now_s)

    def sync_holders(self, now_s: float) -> None:
        """One status call: record what our holders are now; end the strays (at the
        daemon's start, before the loop runs)."""
        read = self.records.read(self._submitted)
        with self.store.transaction():
            self._staged += self.records.record(read, now_s)
        learnt = self.act(self._take())  # a requeued holder's cancel, the strays'
        with self.store.transaction():
            self.learn(learnt)

    def _plan(self, view: PoolView, demand: Demand, now_s: float) -> set[str]:
        """Plan the holders to submit and cancel (run by :meth:`act`); the nodes to
        release."""
        live = self.store.holders(live_only=True)
        # A pending holder that would outlive its node's claim never starts (the plan
        # moved earlier, or the scheduler wanted more slack): cancel it, so that the
        # node is held again below with a limit that fits.
        stuck = [h for h in live if h.state == "pending" and _outlives_claim(h, view)]
        if stuck:
            ids, nodes = tuple(h.job_id for h in stuck), tuple(h.node for h in stuck)
            why = "cannot start before its node's claim"
            self._staged.append(EndHolders(ids, why, "stuck", now_s, nodes))
            live = [h for h in live if h not in stuck]
        allocated = set(demand.allocated)
        running = [h.node for h in live if h.state == "running"]
        pending = [h.node for h in live if h.state == "pending"]
        # Nodes whose last holder failed and that wait for their next try: out of the
        # plan, so that it holds others meanwhile (they have no live holder).
        self.backoff.keep_only(view.pool)
        waiting = self.backoff.waiting(now_s)
        if self.follow_assignment:
            plan = plan_assigned(view.pool, running, pending, allocated, set(demand.hold))
            plan = replace(plan, acquire=tuple(n for n in plan.acquire if n not in waiting))
        else:
            self._holdable = holdable_nodes(view, live, waiting, now_s)
            plan = plan_holders(
                pool=sorted(view.pool - waiting),
                windows_s=view.windows_s,
                running=running,
                pending=pending,
                allocated=allocated,
                demand=demand.nodes,
                keep=self._young_spares(view.pool, running + pending, allocated, now_s),
            )
        by_node = {h.node: h.job_id for h in live}
        if plan.release:
            release = tuple(plan.release)
            ids = tuple(by_node[n] for n in release)
            self._staged.append(EndHolders(ids, "no trainer needs it", "release", now_s, release))
        if not view.growth_held and plan.acquire:  # stale: take nothing on old information
            self._staged.append(Acquire(tuple(plan.acquire), view, now_s))
        return set(plan.release)

    def _young_spares(
        self, pool: frozenset[str], held: list[str], allocated: set[str], now_s: float
    ) -> set[str]:
        """The held pool nodes no trainer uses that became spare less than
        ``SPARE_KEPT_POLLS`` polls ago: the plan keeps them (hold_plan.py)."""
        spare = {n for n in held if n in pool and n not in allocated}
        since = {n: self._spare_since.get(n, now_s) for n in spare}
        self._spare_since = since
        kept_s = SPARE_KEPT_POLLS * self.poll_interval_s
        return {n for n, t in since.items() if now_s - t < kept_s}

    def _end(self, order: EndHolders, learnt: list[Submitted | Ended]) -> None:
        """Carry out one order to end holders, with its log line."""
        ids, kind = order.job_ids, order.kind
        if kind == "stray":
            log.warning(
                "%s: cancelling holder(s) %s with %s",
                self.holders.scheduler,
                ", ".join(f"{j} ({c.node}, {c.scheduler_state})" for j, c in order.strays),
                self.holders.cancel_argv(ids)[0],
            )
        done = self.cancel(
            ids,
            order.reason,
            order.now_s,
            lost=kind == "requeued",
            recorded=kind not in ("stray", "unrecorded"),
            counted=kind != "stray",
            learnt=learnt,
        )
        if done and kind == "stuck":
            log.info(
                "re-holding %s: the holder asked for could not start before a main job",
                ", ".join(order.nodes),
            )
        elif done and kind == "release":
            log.info(
                "released %s: no trainer needs %s",
                ", ".join(order.nodes),
                "it" if len(order.nodes) == 1 else "them",
            )

    def _acquire(
        self, nodes: Sequence[str], view: PoolView, now_s: float, learnt: list[Submitted | Ended]
    ) -> None:
        """Submit a holder for each of ``nodes``; a refused one is logged and tried at a
        later poll. Raises ``HolderError`` when no holder can be submitted at all."""
        # Every holder of the plan submitted at once (SlurmHolders overlaps its sbatch
        # calls): 200 nodes one after another took 9 s (docs/holders.md).
        windows: dict[str, float | None] = {}
        limits_s: dict[str, float | None] = {}
        for node in nodes:
            window = view.windows_s.get(node)
            try:
                minutes = self.holders.time_limit_min(window)
            except WindowTooShortError:
                continue
            windows[node] = window
            limits_s[node] = None if minutes is None else 60.0 * minutes
        leases = None
        if self.lease_dir is not None and windows:
            self._renew_leases(windows, now_s, force=True)
            leases = {node: str(self._lease(node)) for node in windows}
        for node, got in self.holders.acquire_many(windows, leases).items():
            if isinstance(got, HolderError):
                self.counts.errors["holder_submit"] += 1
                log.warning("%s; trying again at a later poll", got)
                continue
            self.counts.acquired += 1
            self._submitted[got] = node
            learnt.append(Submitted(got, node, limits_s[node], now_s))

    def _record_holder(self, job_id: str, node: str, limit_s: float | None, now_s: float) -> None:
        self._submitted.pop(job_id, None)
        try:
            self.store.add_holder(job_id, node, limit_s=limit_s, now_s=now_s)
        except HolderConflictError as exc:
            # Ended by this step's orders; if the scheduler refuses, the next poll finds
            # it a stray (the store does not know it).
            log.error("%s: cancelling the new holder %s", exc, job_id)
            why = "not recorded; the next poll cancels it"
            self._staged.append(EndHolders((job_id,), why, "unrecorded"))

    def cancel(
        self,
        job_ids: Sequence[str],
        reason: str,
        now_s: float | None = None,
        *,
        lost: bool = False,
        recorded: bool = True,
        counted: bool = True,
        learnt: list[Submitted | Ended] | None = None,
    ) -> bool:
        """End holders by our hand: the one path that cancels a holder and records it,
        whoever decides (the hold plan, a requeue, the daemon's exit). One cancel
        command (so never inside a step's transaction), then each holder recorded ended
        with ``reason`` (unless the store never ``recorded`` it): by :meth:`learn` at the
        next step when ``learnt`` is given (a step's act), else at once (the exit); and
        counted released (or ``lost``: it was no longer ours; ``counted`` False: a stray,
        never held for a trainer).
        False when the scheduler refuses: counted and logged, the store keeps the
        holders as they were, and a later poll decides again."""
        try:
            self.holders.release(*job_ids)
        except HolderError as exc:
            self.counts.errors["holder_cancel"] += 1
            log.warning(
                "holders not released (%s): %s; still holding: %s (by hand: %s)",
                reason,
                exc,
                holding(self.store, job_ids),
                " ".join(self.holders.cancel_argv(job_ids)),
            )
            return False
        if recorded and learnt is not None:
            learnt.append(Ended(tuple(job_ids), reason, now_s))
        elif recorded:
            self._record_ended(job_ids, reason, now_s)
        if counted and lost:
            self.counts.lost += len(job_ids)
        elif counted:
            self.counts.released += len(job_ids)
        return True

    def _record_ended(self, job_ids: Sequence[str], reason: str, now_s: float | None) -> None:
        live = {h.job_id for h in self.store.holders(live_only=True)}
        for job_id in job_ids:
            if job_id in live:
                self.store.set_holder_state(job_id, "ended", reason=reason, now_s=now_s)

    def _publish(
        self, view: PoolView, leave_by_s: Mapping[str, float | None], now_s: float
    ) -> None:
        """The pool as ``bftrainer status`` shows it (bftrainer/daemon/pool_status.py)."""
        publish_pool(
            self.store, view, leave_by_s, now_s, self._left_out, self._idle, self.backoff.summary()
        )


def leave_by_s(
    claims_s: Mapping[str, float],
    running: Iterable[HolderRow],
    now_s: float,
    poll_interval_s: float,
) -> dict[str, float | None]:
    """When each node whose holder runs is known to be taken back (epoch s): the
    earlier of the main scheduler's plan for it (``claims_s``: seconds from ``now_s``)
    and the end of its holder's time limit. None: not known (open-ended)."""
    out: dict[str, float | None] = {}
    for h in running:
        ends = [t for t in (h.ends_by_s(poll_interval_s),) if t is not None]
        claim = claims_s.get(h.node)
        if claim is not None:
            ends.append(now_s + claim)
        out[h.node] = min(ends) if ends else None
    return out


def holdable_nodes(
    view: PoolView, live: Sequence[HolderRow], waiting: set[str], now_s: float
) -> int:
    """How many pool nodes the plan could hold now (``Planned.holdable``): the pool less
    the nodes that wait after a failed holder and those whose holder has pended longer
    than a decision waits: a partition's node cap or a reservation keeps it pending, and
    counted, every arrival would wait for it in vain. On a stale pool the plan takes no
    new node: the nodes held already."""
    if view.growth_held:
        return len({h.node for h in live} & view.pool)
    stuck = {h.node for h in live if h.state == "pending" and now_s - h.submit_s >= WAIT_FOR_HELD_S}
    return len(view.pool - waiting - stuck)


def _outlives_claim(holder: HolderRow, view: PoolView) -> bool:
    """Started now, the holder's limit (None: none) would run past its node's claim."""
    claim = view.claims_s.get(holder.node)
    return claim is not None and (holder.limit_s is None or holder.limit_s > claim)
