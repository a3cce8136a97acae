"""The daemon: the core loop on the wall clock, on the nodes its holder jobs keep.

Three parts plug into :class:`bftrainer.loop.Loop` (the same loop the replay runs):

- :class:`HeldPool`, the pool source. Every ``poll_interval_s`` it reads the main
  scheduler's pool (idle nodes nobody planned for, with their windows) and the state of
  our holder jobs in one status call; submits and cancels holders by the hold plan
  (:mod:`bftrainer.acquisition`: only what admitted trainers can use); and tells the loop
  which nodes became usable (a holder runs) or were lost (a holder ended: preempted by
  the main scheduler, or released). The loop only ever sees nodes we hold.
- :class:`SubmissionQueue`: trainers submitted and cancels requested through the
  store (``bftrainer submit`` / ``cancel`` write it from other processes).
- :class:`~bftrainer.live.LiveDriver`: starts and rescales the real trainers.

Everything the daemon knows is in the SQLite store of its state directory, written
before it acts. After a kill -9, :meth:`Daemon.restore` reconciles the holders with the
scheduler (unknown ones are cancelled, ended ones dropped), re-attaches to the trainers'
supervisors (which never stopped) and rebuilds the loop's state from the records. On
SIGTERM the daemon stops taking work: it releases the holders no trainer uses and
exits, leaving running trainers and their holders as they are for the next start.

A bad scheduler reply never stops the daemon: the monitor keeps the last good pool
(stale), a failed holder status keeps the last known holders, a refused holder is
logged and tried again at a later poll. A holder that fails to hold its node is named
with its cause, and its node waits longer before each next try (holders/failures.py).
"""

from __future__ import annotations

import errno
import logging
import math
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

from bftrainer.acquisition import plan_assigned, plan_holders
from bftrainer.config import POLICY_TABLES, Config, ConfigError, load_config, with_overrides
from bftrainer.gpu_slots import GpuSlotGate, GresError, slots_from_gpus
from bftrainer.holders.base import HolderError, Holders, HolderStatus, WindowTooShortError
from bftrainer.holders.failures import HolderBackoff, failed_to_hold
from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.runner import CommandError
from bftrainer.idle_monitor.source import LivePoolSource, PoolView
from bftrainer.live import RESTART_BACKOFF_S, ExecPlan, LiveDriver, job_of
from bftrainer.live_curves import LiveCurves
from bftrainer.loop import (
    Arrival,
    Cancel,
    CurveReport,
    Loop,
    LoopState,
    Policy,
    Polled,
    PoolChange,
    Source,
    Step,
    TrainerState,
    WallClock,
    departure_moved,
)
from bftrainer.policy import LIVE_POLICIES, make_policy
from bftrainer.slots import SlotBook
from bftrainer.state import (
    AllocationRow,
    HolderConflictError,
    HolderRow,
    Store,
    TrainerRow,
    TransitionError,
)
from bftrainer.trainers.channel import renew_lease

log = logging.getLogger(__name__)

UNFINISHED = ("queued", "running", "waiting")
GRES = "gres"  # slots_per_node read from the scheduler's GPU counts


@dataclass(frozen=True)
class DaemonConfig(Config):
    """The loop's settings (``[policy]``) and the daemon's own (``[daemon]``)."""

    poll_interval_s: float = 10.0
    report_every_s: float = 5.0
    # How long a holder outlives the last renewal of its lease (by the daemon at each
    # poll, by a trainer's supervisor while it runs there): the bound on how long a node
    # stays held for nobody when the daemon is gone.
    holder_lease_s: float = 300.0
    # A supervisor that died is started again after restart_backoff_s * 2**k seconds
    # for its k-th restart (bftrainer.live).
    restart_backoff_s: float = RESTART_BACKOFF_S
    # Centre mode (bftrainer.centre): how often agents sync with the allocator, and how
    # long an agent may stay silent before the allocator gives its trainers' nodes away.
    sync_every_s: float = 1.0
    agent_lease_s: float = 60.0
    # Opt-in metrics (bftrainer.daemon_metrics, docs/deployment.md): a node_exporter
    # textfile (a path ending in .prom) and/or an HTTP port on 127.0.0.1. None: off.
    metrics_textfile: str | None = None
    metrics_port: int | None = None
    # slots_per_node = "gres" (the flag or [daemon]): S is read at start from the GPUs
    # of the bf partition's nodes (bftrainer/gpu_slots.py); slots_per_node is then 1
    # until the daemon has read it.
    gpu_slots: bool = False

    def __post_init__(self) -> None:
        if self.slots_per_node == GRES:
            object.__setattr__(self, "slots_per_node", 1)
            object.__setattr__(self, "gpu_slots", True)
        super().__post_init__()
        port = self.metrics_port
        if port is not None and (
            isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535
        ):
            raise ConfigError(f"metrics_port = {port!r}: expected a port number, 1 to 65535")
        textfile = self.metrics_textfile
        if textfile is not None and (
            not isinstance(textfile, str) or not textfile.endswith(".prom")
        ):
            raise ConfigError(
                f"metrics_textfile = {textfile!r}: expected a file name ending in .prom "
                "(node_exporter's textfile collector reads only those)"
            )
        for name in (
            "poll_interval_s",
            "report_every_s",
            "holder_lease_s",
            "restart_backoff_s",
            "sync_every_s",
            "agent_lease_s",
        ):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0.1
            ):
                raise ConfigError(f"{name} = {value!r}: expected a finite number >= 0.1 (seconds)")


_POLICY_FIELDS = {f.name for f in fields(Config)}
# The TOML tables a daemon reads: the loop's [policy] and its own [daemon] (with the
# loop's slots_per_node: trainers share a held node's slots, docs/deployment.md).
DAEMON_TABLES = {
    **POLICY_TABLES,
    "daemon": {
        **{
            f.name: f.name
            for f in fields(DaemonConfig)
            if f.name not in _POLICY_FIELDS and f.name != "gpu_slots"  # slots_per_node = "gres"
        },
        "slots_per_node": "slots_per_node",
    },
}


# ---------------------------------------------------------------------- sources


@dataclass
class HoldCounts:
    """What the holders did since the daemon started, counted where each is logged
    (plain numbers: the metrics, when enabled, read them)."""

    acquired: int = 0  # submitted and accepted by the scheduler
    preempted: int = 0  # ended by a main job
    released: int = 0  # cancelled by the daemon (pending or running)
    lost: int = 0  # ended otherwise: cancelled outside, time limit, lease, requeued
    failed: int = 0  # ended without holding: the script or the node failed
    # Scheduler operations that failed, by kind: holder_status, holder_submit,
    # holder_cancel, pool (the pool source's own failed reads are counted there).
    errors: Counter[str] = field(default_factory=Counter)


class HeldPool:
    """The loop's pool: nodes whose holder runs (see the module docstring)."""

    def __init__(
        self,
        monitor: LivePoolSource,
        holders: Holders,
        store: Store,
        demand: Callable[[], tuple[int, set[str]]],
        poll_interval_s: float,
        usable: Sequence[str] = (),
        *,
        lease_dir: Path | None = None,
        lease_s: float = 300.0,
        assigned: Callable[[], set[str]] | None = None,
    ) -> None:
        self.monitor = monitor
        self.holders = holders
        self.store = store
        self.demand = demand
        # A centre agent holds exactly the nodes the allocator gave its trainers
        # (acquisition.plan_assigned); None: the demand's hold plan (plan_holders).
        self.assigned = assigned
        self.poll_interval_s = poll_interval_s
        self.usable: set[str] = set(usable)
        # Each holder watches a lease file (scripts/slurm/hold-nodes.sbatch): renewed at
        # every poll, so holders end by themselves within lease_s of the daemon's end
        # unless a trainer's supervisor renews them. None: no leases (time limits only).
        self.lease_dir = lease_dir
        self.lease_s = lease_s
        self._lease_until: dict[str, float] = {}
        self._next_s = -math.inf
        # When each usable node leaves, as last told to the loop (None: not known).
        self._told: dict[str, float | None] = {}
        self._view: PoolView | None = None  # the last poll's
        self._replan = False  # polled since the last hold plan
        self.counts = HoldCounts()
        # Nodes whose last holder failed wait before the next (holders/failures.py).
        self.backoff = HolderBackoff(2 * poll_interval_s)
        # --slots-per-node gres: nodes whose GPU count is not S stay out (set at start).
        self.gate: GpuSlotGate | None = None
        self._left_out: dict[str, str] = {}  # node -> why, as the gate last said
        self._idle: frozenset[str] = frozenset()  # the pool before the gate, for status

    @property
    def view(self) -> PoolView | None:
        """The pool as the last poll read it (None before the first)."""
        return self._view

    def jobs(self) -> dict[str, str]:
        """node -> the job id of its live holder."""
        return {h.node: h.job_id for h in self.store.holders(live_only=True)}

    def exec_plan(self, nodes: Sequence[str]) -> ExecPlan:
        jobs = self.jobs()
        # Slurm: workers run as steps inside the holders. LSF: over ssh (blaunch is not wired).
        mode = "slurm" if self.holders.scheduler == "slurm" else "ssh"
        leases = {} if self.lease_dir is None else {n: str(self._lease(n)) for n in nodes}
        return ExecPlan(
            mode,
            {n: jobs[n] for n in nodes if n in jobs},
            leases=leases,
            lease_s=self.lease_s,
        )

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

    def poll(self, now_s: float) -> Polled:
        """Read the scheduler: the nodes whose holder started or ended since the last
        poll, and when each held node leaves. Holders are submitted and cancelled in
        :meth:`settle`, on the step's decision."""
        if now_s < self._next_s:
            return Polled((), self._next_s)
        self._next_s = now_s + self.poll_interval_s
        self._replan = True
        try:
            self.monitor.poll()  # keeps the last good pool (stale) on a bad reply
        except (CommandError, ValueError) as exc:
            self.counts.errors["pool"] += 1
            log.warning("pool not read, keeping the last good one: %s", exc)
        try:
            self.sync_holders(now_s)
        except (HolderError, CommandError) as exc:
            self.counts.errors["holder_status"] += 1
            log.warning("holders not read, keeping the last known: %s", exc)
            return Polled((), self._next_s)
        live = self.store.holders(live_only=True)
        self._renew_leases((h.node for h in live), now_s)
        running = {h.node: h for h in live if h.state == "running"}
        view = self.monitor.view()  # one view per poll: plan and event agree
        if self.gate is not None:
            # A held node whose GPU count is not S leaves the loop's pool (its holder is
            # then released by the plan: outside the pool, no trainer on it).
            users: dict[str, set[str]] = {}
            for tid, a in self.store.current_allocations().items():
                for n in a.nodes:
                    users.setdefault(n, set()).add(tid)
            self._left_out = self.gate.misfits(view, {n: users.get(n, set()) for n in running})
            self._idle = view.pool
            view = self.gate.without(view, set(self._left_out))
            running = {n: h for n, h in running.items() if n not in self._left_out}
        joined, left = running.keys() - self.usable, self.usable - running.keys()
        self.usable = set(running)
        self._view = view
        leave_by = leave_by_s(view.claims_s, running.values(), now_s, self.poll_interval_s)
        # Tell the loop the departures it does not know yet (all of them after a restart).
        changed = {n: t for n, t in leave_by.items() if departure_moved(self._told, n, t)}
        self._told = leave_by
        if not joined and not left and not changed:
            return Polled((), self._next_s)
        if joined or left:
            self.store.add_pool_event(
                joined=joined,
                left=left,
                windows_s=dict(view.windows_s),
                stale=view.stale,
                now_s=now_s,
            )
        windows = {n: None if t is None else max(0.0, t - now_s) for n, t in changed.items()}
        event = PoolEvent(now_s, joined=frozenset(joined), left=frozenset(left), windows_s=windows)
        return Polled((PoolChange(event),), self._next_s)

    def settle(self, now_s: float, decided: bool) -> tuple[PoolChange, ...]:
        """Hold what the decision needs: after a poll or a decision, submit and cancel
        holders by the hold plan. Only nodes the decision left free are released, and
        they leave the loop's pool in this same step (the returned change), so the loop
        never hands a trainer a node whose holder is gone."""
        if not (self._replan or decided) or self._view is None:
            return ()
        self._replan = False
        try:
            released = self._plan(self._view, now_s) & self.usable
        except (HolderError, CommandError) as exc:  # each is handled where it arises;
            # this is the step's guard: no scheduler reply ends the daemon
            self.counts.errors["holder_submit"] += 1
            log.warning("holders not planned at this poll, trying again at the next: %s", exc)
            released = set()
        self.usable -= released
        for n in released:
            self._told.pop(n, None)
        self._publish(self._view, self._told, now_s)
        if not released:
            return ()
        self.store.add_pool_event(
            joined=(), left=released, windows_s={}, stale=self._view.stale, now_s=now_s
        )
        return (PoolChange(PoolEvent(now_s, left=frozenset(released))),)

    def sync_holders(self, now_s: float) -> None:
        """One status call: record what our holders are now; cancel unknown ones."""
        known = {h.job_id: h for h in self.store.holders(live_only=True)}
        result = self.holders.reconcile({j: h.node for j, h in known.items()})
        for job_id, status in result.live.items():
            try:
                self.store.set_holder_state(job_id, status.state, reason=status.reason, now_s=now_s)
            except TransitionError:
                # Running in the store, pending in the scheduler: requeued (holders are
                # --no-requeue, so only a site's override does this). Not ours any more.
                log.warning(
                    "%s's holder %s was requeued by the scheduler: releasing it",
                    status.node,
                    job_id,
                )
                self.holders.release(job_id)
                self.store.set_holder_state(job_id, "ended", reason="requeued", now_s=now_s)
                self.counts.lost += 1
                continue
            was = known[job_id]
            if status.state == "running":
                self.backoff.held(status.node)
            if status.state == "running" and was.state == "pending":
                limit = "none" if was.limit_s is None else f"up to {was.limit_s / 60:.0f} min"
                log.info("holding %s (holder %s, time limit: %s)", status.node, job_id, limit)
        for job_id, status in result.gone.items():
            if job_id in known and failed_to_hold(known[job_id].state, status.reason):
                self._failed(known[job_id], status, now_s)
            elif job_id in known:
                self.holders.forget(job_id)
                why = self._why_ended(known[job_id], status.reason, now_s)
                self.store.set_holder_state(job_id, "ended", reason=why, now_s=now_s)
                if status.reason == "preempted":
                    self.counts.preempted += 1
                else:
                    self.counts.lost += 1
                log.info("lost %s: its holder %s %s", status.node, job_id, why)

    def _failed(self, holder: HolderRow, status: HolderStatus, now_s: float) -> None:
        """A holder that failed to hold: its cause in one line, its node backed off."""
        cause = self.holders.why_failed(holder.job_id, status)
        self.store.set_holder_state(holder.job_id, "ended", reason=f"failed: {cause}", now_s=now_s)
        self.counts.failed += 1
        entry = self.backoff.failed(holder.node, holder.job_id, cause, now_s)
        log.warning(
            "holder %s for %s failed: %s; %s is tried again in %.3g s (failure %d in a row)",
            holder.job_id,
            holder.node,
            cause,
            holder.node,
            entry.retry_s - now_s,
            entry.failures,
        )
        stderr = self.holders.stderr_file(holder.job_id)
        if stderr is not None and status.reason == "failed" and not stderr.exists():
            # Slurm fails a job whose --error folder the node cannot see: the state
            # directory is not shared with the nodes. Holders go on without the file.
            log.warning(
                "holder stderr is not written to %s (a folder the nodes do not see?): "
                "holders keep no stderr from now on",
                stderr.parent,
            )
            self.holders.stderr_dir = None

    def _why_ended(self, holder: HolderRow, reason: str, now_s: float) -> str:
        """Why a holder ended, in an operator's words (the scheduler's state as given)."""
        if reason == "preempted":
            return "was preempted by a main job"
        if reason in ("cancelled", "canceled"):
            return "was cancelled outside bftrainer"
        if reason == "timeout":
            return "reached its time limit"
        if reason == "not listed":
            return f"is no longer listed by {self.holders.status_argv()[0]}"
        lease = self._lease_until.get(holder.node)
        if reason == "completed" and lease is not None and lease <= now_s:
            return "ended by itself: its lease expired"
        if reason == "completed" and holder.state == "running":
            return "ended by itself"
        return f"ended ({reason or 'no reason given'})"

    def _plan(self, view: PoolView, now_s: float) -> set[str]:
        """Submit and cancel holders by the hold plan; the nodes released."""
        live = self.store.holders(live_only=True)
        # A pending holder that would outlive its node's claim never starts (the plan
        # moved earlier, or the scheduler wanted more slack): cancel it, so that the
        # node is held again below with a limit that fits.
        stuck = [h.job_id for h in live if h.state == "pending" and _outlives_claim(h, view)]
        if stuck and self._release(stuck, "cannot start before its node's claim", now_s):
            log.info(
                "re-holding %s: the holder asked for could not start before a main job",
                ", ".join(h.node for h in live if h.job_id in stuck),
            )
            live = [h for h in live if h.job_id not in stuck]
        demand, allocated = self.demand()
        running = [h.node for h in live if h.state == "running"]
        pending = [h.node for h in live if h.state == "pending"]
        # Nodes whose last holder failed and that wait for their next try: out of the
        # plan, so that it holds others meanwhile (they have no live holder).
        self.backoff.keep_only(view.pool)
        waiting = self.backoff.waiting(now_s)
        if self.assigned is not None:
            plan = plan_assigned(view.pool, running, pending, allocated, self.assigned())
            plan = replace(plan, acquire=tuple(n for n in plan.acquire if n not in waiting))
        else:
            plan = plan_holders(
                pool=sorted(view.pool - waiting),
                windows_s=view.windows_s,
                running=running,
                pending=pending,
                allocated=allocated,
                demand=demand,
            )
        by_node = {h.node: h.job_id for h in live}
        released: set[str] = set()
        if plan.release and self._release(
            [by_node[n] for n in plan.release], "no trainer needs it", now_s
        ):
            log.info(
                "released %s: no trainer needs %s",
                ", ".join(plan.release),
                "it" if len(plan.release) == 1 else "them",
            )
            released = set(plan.release)
        if view.growth_held:
            return released  # the pool is stale: take nothing new on old information
        try:
            self._acquire(plan.acquire, view, now_s)
        except HolderError as exc:  # a read all holders need (the partition's MaxTime)
            self.counts.errors["holder_submit"] += 1
            log.warning("holders not submitted, trying again at a later poll: %s", exc)
        return released

    def _acquire(self, nodes: Sequence[str], view: PoolView, now_s: float) -> None:
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
            try:
                self.store.add_holder(got, node, limit_s=limits_s[node], now_s=now_s)
            except HolderConflictError as exc:
                log.error("%s: cancelling the new holder %s", exc, got)
                self._cancel_unrecorded(got)

    def _cancel_unrecorded(self, job_id: str) -> None:
        """Cancel a holder the store refused; if the scheduler refuses too, the next
        poll's reconcile cancels it (the store does not know it)."""
        try:
            self.holders.release(job_id)
        except HolderError as exc:
            self.counts.errors["holder_cancel"] += 1
            log.warning("%s; the next poll cancels it", exc)
            return
        self.counts.released += 1

    def _release(self, jobs: Sequence[str], reason: str, now_s: float) -> bool:
        """Cancel holders and record them ended; False (and logged) when refused."""
        try:
            self.holders.release(*jobs)
        except HolderError as exc:
            self.counts.errors["holder_cancel"] += 1
            log.warning("holders not released: %s", exc)
            return False
        for job_id in jobs:
            self.store.set_holder_state(job_id, "ended", reason=reason, now_s=now_s)
        self.counts.released += len(jobs)
        return True

    def _publish(
        self, view: PoolView, leave_by_s: Mapping[str, float | None], now_s: float
    ) -> None:
        """The pool as ``bftrainer status`` shows it: a held node's window is when we
        lose it (``leave_by_s``), another's the main scheduler's."""
        holders = {h.node: h for h in self.store.holders(live_only=True)}
        # node -> trainer -> its slots there (S = 1: each node one trainer, slot 0).
        users: dict[str, dict[str, list[int]]] = {}
        allocations = self.store.current_allocations()
        for tid, a in sorted(allocations.items()):
            for n in dict.fromkeys(a.nodes):
                users.setdefault(n, {})[tid] = list(a.slots.get(n, (0,)))
        shared = any(a.slots for a in allocations.values())
        nodes = {}
        for n in sorted(set(view.pool) | set(holders)):
            h = holders.get(n)
            window = view.windows_s.get(n)
            if n in leave_by_s:
                leaves = leave_by_s[n]
                window = None if leaves is None else max(0.0, leaves - now_s)
            nodes[n] = {
                "window_s": window,
                "holder": h.job_id if h else None,
                "holder_state": h.state if h else None,
                "trainer": ",".join(users[n]) if n in users else None,
            }
            if shared:
                nodes[n]["slots"] = users.get(n, {})
        for n, why in sorted(self._left_out.items()):  # idle or held, with their GPUs
            if n in nodes or n in self._idle:
                empty = {"window_s": None, "holder": None, "holder_state": None, "trainer": None}
                nodes.setdefault(n, empty)["left_out"] = why
        self.store.set_setting(
            "pool",
            {
                "time_s": now_s,
                "stale": view.stale,
                "nodes": nodes,
                "holders_failing": self.backoff.summary(),
            },
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


def _outlives_claim(holder: HolderRow, view: PoolView) -> bool:
    """Started now, the holder's limit (None: none) would run past its node's claim."""
    claim = view.claims_s.get(holder.node)
    return claim is not None and (holder.limit_s is None or holder.limit_s > claim)


class SubmissionQueue:
    """Trainers submitted and cancels requested through the store, each delivered once."""

    def __init__(
        self, store: Store, known: Sequence[str] = (), curves: LiveCurves | None = None
    ) -> None:
        self.store = store
        self.known: set[str] = set(known)
        self.cancelled: set[str] = set()
        self.curves = curves or LiveCurves()

    def poll(self, now_s: float) -> Polled:
        """New trainers on their prior; waiting trainers' priors restated where the best
        measured rate rose (as the replay's ``PriorArrivals``)."""
        inputs: list[Arrival | Cancel | CurveReport] = list(self.curves.restated())
        for row in self.store.trainers(UNFINISHED):
            if row.id not in self.known:
                self.known.add(row.id)
                inputs.append(Arrival(self.curves.prior_job(job_of(row))))
            if row.cancel_requested and row.id not in self.cancelled:
                self.cancelled.add(row.id)
                inputs.append(Cancel(row.id))
        return Polled(tuple(inputs))


# ---------------------------------------------------------------------- the daemon


@dataclass(frozen=True)
class DaemonReading:
    """The daemon's figures at one instant, as plain data; :mod:`bftrainer.daemon_metrics`
    renders them for Prometheus. Counts of events are since the daemon started."""

    pool_nodes: int  # the idle pool the main scheduler leaves (held nodes included)
    held_nodes: int  # nodes whose holder runs: the loop's pool
    allocated_nodes: int  # held nodes given to trainers
    trainers: Mapping[str, int]  # by state, every state of the store
    holders: HoldCounts
    rescales: int
    command_errors: Mapping[str, int]  # failed scheduler operations, by kind
    pool_read_s: float | None  # when the pool was last read well (epoch s; None: never)
    # Holders failing to hold (HolderBackoff.summary: the latest cause, the nodes, the
    # next try); None: none failing.
    holders_failing: Mapping[str, Any] | None = None


class CentreLink(Protocol):
    """A centre agent's tie to the allocator (bftrainer.centre.agent): a source of the
    agent's loop that reports its trainers and brings back the allocator's assignment,
    the policy that follows it, and the nodes the holders should keep."""

    @property
    def policy(self) -> Policy: ...

    def poll(self, now_s: float) -> Polled: ...

    def assigned_nodes(self) -> set[str]: ...

    def attach(self, loop: Loop, store: Store) -> None: ...


class MetricsSink(Protocol):
    """Where the daemon's figures go when metrics are enabled (the loop never knows)."""

    def update(self, reading: DaemonReading, latency_s: float | None) -> None:
        """The figures now, and the latency of the decision just made (None: none)."""
        ...


class StepLog:
    """The loop's observer: logs each decision and its latency, checks after each
    recorded step that the loop's pool holds only nodes whose holder runs, and calls
    ``after`` at every wake-up (the step, or None when nothing was recorded)."""

    def __init__(
        self,
        check: Callable[[], None] = lambda: None,
        after: Callable[[Step | None], None] | None = None,
    ) -> None:
        self.check = check
        self.after = after

    def interval(self, t0_s: float, t1_s: float, pool_nodes: int, processed: float) -> None:
        if self.after is not None:
            self.after(None)

    def step(self, step: Step) -> None:
        self.check()
        if self.after is not None:
            self.after(step)
        if step.decided:
            log.debug(
                "decided at %.1f: pool %d, allocated %d, running %d, waiting %d "
                "(joined %d, left %d, arrivals %d, completions %d) %s in %.1f ms, "
                "latency %.1f ms, T_fwd %s",
                step.time_s,
                step.pool_nodes,
                step.allocated_nodes,
                step.running,
                step.waiting,
                step.joined,
                step.left,
                step.arrivals,
                step.completions,
                step.status,
                step.solve_s * 1e3,
                step.latency_s * 1e3,
                "-" if step.t_fwd_s is None else f"{step.t_fwd_s:.0f} s",
            )


class Daemon:
    """Wires the store, the pool, the holders and the live driver to the loop."""

    def __init__(
        self,
        store: Store,
        state_dir: Path,
        monitor: LivePoolSource,
        holders: Holders,
        config: DaemonConfig,
        *,
        env: dict[str, str] | None = None,
        metrics: MetricsSink | None = None,
        centre: CentreLink | None = None,
    ) -> None:
        self.store = store
        self.state_dir = state_dir
        self.config = config
        self.monitor = monitor
        self.metrics = metrics
        self.clock = WallClock()
        self.loop: Loop | None = None
        self._stop_requested = False
        self.pool = HeldPool(
            monitor,
            holders,
            store,
            self._demand,
            config.poll_interval_s,
            lease_dir=state_dir / "leases",
            lease_s=config.holder_lease_s,
            assigned=centre.assigned_nodes if centre is not None else None,
        )
        # A centre agent: the allocator decides (centre.policy follows it), the link
        # reports this user's trainers to it; None: this daemon decides alone.
        self.centre = centre
        self.driver = LiveDriver(
            store,
            state_dir,
            self.pool.exec_plan,
            env=env,
            report_every_s=config.report_every_s,
            slots_per_node=config.slots_per_node,
            restart_backoff_s=config.restart_backoff_s,
        )
        self.queue = SubmissionQueue(store, curves=self.driver.curves)

    def _demand(self) -> tuple[int, set[str]]:
        """Nodes the admitted trainers can use (their n_max summed; with S slots per
        node, in slots: the nodes they fill packed), and those in use."""
        if self.loop is None:
            return 0, set()
        admitted = self.loop.admitted()
        allocated = {n for t in self.loop.trainers.values() for n in t.nodes}
        slots = sum(t.job.n_max for t in admitted)
        return -(-slots // self.config.slots_per_node), allocated

    def restore(self) -> LoopState | None:
        """The loop's state from the store, after reconciling holders with the scheduler
        and re-attaching to the trainers that still run; None if asked to stop before
        the scheduler answered."""
        now_s = self._sync_holders_at_start()
        if now_s is None:
            return None
        running = sorted(h.node for h in self.store.holders(live_only=True) if h.state == "running")
        self.pool.usable = set(running)
        held = set(running)
        allocations = self.store.current_allocations()
        trainers: list[TrainerState] = []
        lost: list[str] = []
        for row in self.store.trainers(UNFINISHED):
            trainers.append(self._restore_trainer(row, held, allocations.get(row.id), lost))
        self._note_slot_count(trainers, lost)
        self.queue.known = {t.id for t in trainers}
        if trainers:
            log.info("restored %d trainer(s) on %d held node(s)", len(trainers), len(running))
        return LoopState(now_s=now_s, pool=tuple(running), trainers=trainers)

    def _restore_trainer(
        self, row: TrainerRow, held: set[str], alloc: AllocationRow | None, lost: list[str]
    ) -> TrainerState:
        """The trainer on its nodes that are still held, each slot at most once (the
        slot book takes back the slots it had, those that still exist)."""
        stored = alloc.nodes if alloc is not None else ()
        slots, gone = self.driver.book.restore(
            row.id, [n for n in stored if n in held], alloc.slots if alloc is not None else {}
        )
        nodes = tuple(sorted(n for n, s in slots.items() for _ in s))
        lost += [f"{k} of {row.id}'s slot(s) on {n}" for n, k in gone.items()]
        self.driver.attach(row, nodes)
        return TrainerState(
            self.driver.curves.prior_job(job_of(row)),
            nodes=nodes,
            started_s=row.started_s,
            processed_samples=float(row.samples_done),
        )

    def _note_slot_count(self, trainers: Sequence[TrainerState], lost: Sequence[str]) -> None:
        """Say once when the slots per node changed under running trainers (a restart
        with another --slots-per-node): slots that no longer exist are given up, their
        trainers shrink at a step boundary and lose no work; workers keep their share."""
        slots = self.config.slots_per_node
        before = self.store.get_setting("slots_per_node", 1)
        nodes = sorted({n for t in trainers for n in t.nodes})
        if before != slots and (nodes or lost):
            log.warning(
                "slots per node changed from %s to %d while trainers run on %s: %s"
                "their running workers keep the CPUs and GPUs they started with until they "
                "restart",
                before,
                slots,
                ", ".join(nodes) or "no node now",
                f"{'; '.join(lost)} no longer exist and are given up (the trainers shrink "
                "at a step boundary; no work is lost); "
                if lost
                else "",
            )
        if before != slots:
            self.store.set_setting("slots_per_node", slots)

    def use_gpu_slots(self) -> bool:
        """--slots-per-node gres: read S (:meth:`slots_at_start`), then run with it, and
        keep the nodes of another GPU count out of the pool; False if asked to stop."""
        slots = self.slots_at_start()
        if slots is None:
            return False
        self.config = replace(self.config, slots_per_node=slots)
        self.driver.book = SlotBook(slots)
        self.pool.gate = GpuSlotGate(slots)
        return True

    def slots_at_start(self) -> int | None:
        """--slots-per-node gres: S from the bf partition's GPU counts (gpu_slots.py),
        read before anything else, however long the scheduler takes to answer (its
        failures are the pool source's one line each); None if asked to stop meanwhile.
        Raises ``GresError`` when no node has a GPU count: a number is needed then."""
        while not self._stop_requested:
            now_s = self.clock.now_s()
            try:
                self.monitor.poll()  # a failed read is its one line
            except (CommandError, ValueError) as exc:
                log.warning("GPU counts not read at start: %s", exc)
            if self.monitor.last_reading is not None:
                view = self.monitor.view()
                slots = slots_from_gpus(view.gpus)
                read = len(view.gpus) + len(view.gpu_errors)
                if slots is None:
                    raise GresError(
                        f"--slots-per-node gres: none of the {read} node(s) read has a GPU "
                        f"count ({self.monitor.scheduler.gpu_field})"
                        + (f"; {len(view.gpu_errors)} do not parse" if view.gpu_errors else "")
                        + ": give --slots-per-node a number"
                    )
                fits = sum(c == slots for c in view.gpus.values())
                log.info(
                    "slots per node: %d, the GPU count of %d of the %d node(s) read",
                    slots,
                    fits,
                    read,
                )
                return slots
            self.clock.wait_until(now_s + self.pool.poll_interval_s)
        return None

    def run(self) -> None:
        """Run until :meth:`request_stop`; then release what no trainer uses."""
        self.store.set_setting("slots_from", GRES if self.config.gpu_slots else "config")
        if self.config.gpu_slots and not self.use_gpu_slots():
            log.info("daemon stopped before the scheduler answered; nothing changed")
            return
        state = self.restore()
        if state is None:
            log.info("daemon stopped before the scheduler answered; nothing changed")
            return
        after = self._publish_metrics if self.metrics is not None else None
        sources: list[Source] = [self.pool, self.queue]
        policy = make_policy(self.config)
        if self.centre is not None:
            sources.append(self.centre)
            policy = self.centre.policy
        self.loop = Loop(
            sources,
            self.driver,
            self.clock,
            self.config,
            policy=policy,
            observer=StepLog(self.check_pool, after),
            state=state,
            keep_finished=False,  # the store has them
        )
        if self.centre is not None:
            self.centre.attach(self.loop, self.store)
        self._publish_metrics(None)
        try:
            self.loop.run()
        finally:
            self._shutdown()
            self._publish_metrics(None)

    def reading(self) -> DaemonReading:
        """The daemon's figures now (see :class:`DaemonReading`)."""
        view = self.pool.view
        last = self.monitor.last_reading
        trainers = self.loop.trainers.values() if self.loop is not None else ()
        counts = self.pool.counts
        return DaemonReading(
            pool_nodes=len(view.pool) if view is not None else 0,
            held_nodes=sum(h.state == "running" for h in self.store.holders(live_only=True)),
            allocated_nodes=len({n for t in trainers for n in t.nodes}),
            trainers=self.store.trainer_counts(),
            holders=replace(counts, errors=Counter(counts.errors)),
            rescales=self.driver.rescales,
            command_errors=dict(counts.errors + self.monitor.failed_reads),
            pool_read_s=last.time_s if last is not None else None,
            holders_failing=self.pool.backoff.summary(),
        )

    def _publish_metrics(self, step: Step | None) -> None:
        if self.metrics is None:
            return
        latency = step.latency_s if step is not None and step.decided else None
        self.metrics.update(self.reading(), latency)

    def check_pool(self) -> None:
        """The invariant the daemon is built on: every node the loop may hand a trainer
        has a running holder. Logged as an error (never raised: trainers go on)."""
        if self.loop is None:
            return
        running = {h.node for h in self.store.holders(live_only=True) if h.state == "running"}
        stray = sorted(set(self.loop.pool) - running)
        if stray:
            log.error(
                "internal error: the pool has %s without a running holder (please report)",
                ", ".join(stray),
            )

    def _sync_holders_at_start(self) -> float | None:
        """Read our holders before anything else, however long the scheduler takes to
        answer: a trainer's nodes are only known from them. One line per failed try;
        None if the daemon is asked to stop meanwhile."""
        while not self._stop_requested:
            now_s = self.clock.now_s()
            try:
                self.pool.sync_holders(now_s)
                return now_s
            except (HolderError, CommandError) as exc:
                self.pool.counts.errors["holder_status"] += 1
                log.warning(
                    "holders not read at start, trying again in %g s: %s",
                    self.pool.poll_interval_s,
                    exc,
                )
            self.clock.wait_until(now_s + self.pool.poll_interval_s)
        return None

    def request_stop(self) -> None:
        self._stop_requested = True
        self.clock.wake()
        if self.loop is not None:
            self.loop.request_stop()

    def _shutdown(self) -> None:
        """Stop taking work: cancel holders that no trainer runs on; leave the rest."""
        try:
            self._release_spare()
        except (sqlite3.Error, OSError) as exc:
            if not state_unwritable(exc):
                raise
            log.warning("holders not released at exit: the state cannot be written (%s)", exc)
        log.info("daemon stopped; %d trainer(s) left running", len(self.driver.launchers))

    def _release_spare(self) -> None:
        allocated = {n for a in self.store.current_allocations().values() for n in a.nodes}
        spare = [h for h in self.store.holders(live_only=True) if h.node not in allocated]
        if spare:
            try:
                self.pool.holders.release(*(h.job_id for h in spare))
            except HolderError as exc:
                self.pool.counts.errors["holder_cancel"] += 1
                log.warning("holders not released at exit: %s", exc)
            else:
                for h in spare:
                    self.store.set_holder_state(h.job_id, "ended", reason="released at exit")
                self.pool.counts.released += len(spare)


# errno values that mean "this file system cannot take the write", not a bug.
_UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO})


def state_unwritable(exc: BaseException) -> bool:
    """Whether ``exc`` says the state directory cannot be written (full disk, quota,
    read-only, permissions, I/O error) rather than a bug."""
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return any(
            w in text for w in ("full", "readonly", "read-only", "disk i/o", "unable to open")
        )
    return isinstance(exc, OSError) and exc.errno in _UNWRITABLE


def load_daemon_config(
    path: Path | None, overrides: Mapping[str, object], names: Mapping[str, str] | None = None
) -> DaemonConfig:
    """The daemon's settings: defaults, then the TOML file's, then ``overrides`` (those not
    None; ``names`` maps a field to the flag that set it, for errors)."""
    config = DaemonConfig()
    if path is not None:
        config = load_config(path, config, DAEMON_TABLES)
    config = with_overrides(config, overrides, names)
    if config.policy not in LIVE_POLICIES:
        where = f"{path}: " if path is not None else ""
        raise ConfigError(
            f"{where}policy = {config.policy!r}: the daemon runs {' or '.join(LIVE_POLICIES)} "
            "(the others are replay baselines)"
        )
    return config
