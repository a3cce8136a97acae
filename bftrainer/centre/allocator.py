"""The centre's allocator: one core loop for every user's trainers, holding no node.

``bftrainer daemon --centre`` runs :class:`Allocator`: the same :class:`~bftrainer.loop.Loop`
as the single-user daemon and the replay, with

- :class:`CentrePool` as the pool source: the idle pool the main scheduler leaves (nodes
  held by holder jobs of the ``bf`` partition, any user's, count as idle), read every
  ``poll_interval_s``;
- an :class:`~bftrainer.loop.Inbox` fed by the transport's threads: each agent's sync
  becomes arrivals, curve reports and completions of its user's trainers;
- :class:`AgentLeases`: an agent that has not synced for ``agent_lease_s`` has its
  trainers withdrawn, so the next decision gives their nodes to others (never at once:
  a restarting agent keeps its trainers' nodes for that long);
- :class:`RemoteDriver`: a decision is not acted on here; after each step the node sets
  are published, and each agent reads its trainers' at its next sync and acts with its
  user's rights (bftrainer.centre.agent_link).

Identity comes from the kernel (``SO_PEERCRED``): a trainer is named ``user/t0001`` by the
uid that reported it, and a request about another user's trainer is refused. The
allocator keeps no state of its own: after a restart (kill -9 included) it waits
``restore_grace_s`` for the agents' syncs, and rebuilds the loop's state from what they
report (each trainer on the nodes it has, where the pool still has them).
"""

from __future__ import annotations

import grp
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bftrainer.centre import protocol
from bftrainer.centre.protocol import SyncReply, SyncRequest, TrainerReport, centre_id, split_id
from bftrainer.centre.refusals import Refusals
from bftrainer.centre.transport import Peer, Request, RequestRefused, Server
from bftrainer.idle_monitor.runner import CommandError
from bftrainer.idle_monitor.source import LivePoolSource
from bftrainer.loop import (
    Arrival,
    Cancel,
    Clock,
    Completion,
    CurveReport,
    Inbox,
    Input,
    Loop,
    LoopState,
    Policy,
    Polled,
    PoolChange,
    Progress,
    Step,
    TrainerState,
    WallClock,
)
from bftrainer.loop.jobs import JobSpec
from bftrainer.policies.refusing import Refusing
from bftrainer.policies.registry import make_policy
from bftrainer.service.base import LiveService, StepObserver
from bftrainer.service.pool_changes import PoolChanges
from bftrainer.service.reading import AgentsReading, MetricsSink, Reading, UserReading

log = logging.getLogger(__name__)

Curve = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class CentreSettings:
    """The allocator's own timing (the loop's policy settings are a ``Config``)."""

    poll_interval_s: float = 10.0  # how often the scheduler's pool is read
    sync_every_s: float = 1.0  # how often agents sync (told to them in each reply)
    agent_lease_s: float = 60.0  # an agent silent this long loses its trainers' nodes
    restore_grace_s: float = 3.0  # at start, how long to wait for the agents' syncs
    hold_grace_s: float = 120.0  # a node assigned to a user and not held this long ...
    refused_for_s: float = 600.0  # ... is refused to that user this long (refusals.py)
    holder_lease_s: float = 300.0  # how long a silent agent's holders may stay (the agents')


# ---------------------------------------------------------------------- the pool


class PoolFeed(Protocol):
    """The allocator's pool source: a loop source that can also be read once at start."""

    def prime(self, now_s: float) -> tuple[str, ...] | None: ...

    def poll(self, now_s: float) -> Polled: ...


class CentrePool:
    """The loop's pool source: the scheduler's idle pool, as changes (joins, leaves,
    moved windows), one read every ``poll_interval_s``."""

    @property
    def read_s(self) -> float | None:
        """When the pool was last read well (epoch s; None: never)."""
        last = self.monitor.last_reading
        return None if last is None else last.time_s

    @property
    def failed_reads(self) -> Mapping[str, int]:
        """Scheduler reads that failed since the start, by what was read."""
        return dict(self.monitor.failed_reads)

    def __init__(self, monitor: LivePoolSource, poll_interval_s: float) -> None:
        self.monitor = monitor
        self.poll_interval_s = poll_interval_s
        self.changes = PoolChanges()
        self._next_s = -math.inf

    def prime(self, now_s: float) -> tuple[str, ...] | None:
        """Read the pool once (at start): the nodes the restored loop starts with; None
        while the scheduler cannot be read (an empty pool would take every trainer's
        nodes away)."""
        self._read()
        if self.monitor.last_reading is None:
            return None
        view = self.monitor.view()
        self.changes.start(view.pool, _leave_times(view.windows_s, now_s))
        self._next_s = now_s + self.poll_interval_s
        return tuple(sorted(self.changes.known))

    def poll(self, now_s: float) -> Polled:
        if now_s < self._next_s:
            return Polled((), self._next_s)
        self._next_s = now_s + self.poll_interval_s
        self._read()
        view = self.monitor.view()
        pool = set(view.pool)
        if view.growth_held:  # stale: a node that looks idle may be planned for
            pool &= self.changes.known
        event = self.changes.diff(pool, _leave_times(view.windows_s, now_s), now_s)
        return Polled(() if event is None else (PoolChange(event),), self._next_s)

    def _read(self) -> None:
        try:
            self.monitor.poll()  # keeps the last good pool (stale) on a bad reply
        except (CommandError, ValueError) as exc:
            log.warning("pool not read, keeping the last good one: %s", exc)


def _leave_times(windows_s: Mapping[str, float | None], now_s: float) -> dict[str, float | None]:
    """When each node leaves (epoch s; None: open-ended or not known)."""
    return {n: None if w is None else now_s + w for n, w in windows_s.items()}


# ---------------------------------------------------------------------- the driver


class RemoteDriver:
    """The loop's driver when the agents act: nothing happens here (costs are real and
    paid by the trainers); the node sets go out through the published snapshot."""

    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        return Progress()

    def next_wakeup_s(self, trainers: Sequence[TrainerState], now_s: float) -> float:
        return math.inf

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        return 0.0

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        return 0.0

    def cancel(self, trainer: TrainerState) -> None:
        pass


# ---------------------------------------------------------------------- agents


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat's 22nd
    field); None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class AgentRecord:
    """What the allocator knows of one user's agent (keyed by the kernel's uid)."""

    uid: int
    user: str
    account: str
    last_s: float
    pid: int  # the agent's process, as the kernel said at its last sync
    # Its start time (process_start): with the pid, the process's identity.
    started: int | None = None
    ids: dict[str, str] = field(default_factory=dict)  # local id -> the loop's id
    curves: dict[str, dict[str, Curve]] = field(default_factory=dict)  # loop id -> metric
    cancels: set[str] = field(default_factory=set)  # local ids whose cancel was asked


class AgentLeases:
    """A source of the loop: withdraws the trainers of agents silent for ``lease_s``."""

    def __init__(self, allocator: Allocator, lease_s: float) -> None:
        self.allocator = allocator
        self.lease_s = lease_s

    def poll(self, now_s: float) -> Polled:
        return Polled(*self.allocator.expire_agents(now_s, self.lease_s))


def account_of(gid: int) -> str:
    """The account a user's trainers are charged to for ``--fair-by account``: the name
    of the group the kernel gave the peer (its primary group)."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


class Allocator(LiveService):
    """Serves the agents and users on ``socket_dir`` and runs the loop over the pool."""

    def __init__(
        self,
        socket_dir: Path,
        pool: PoolFeed,
        config: Any,  # bftrainer.policies.config.Config (the loop's settings)
        settings: CentreSettings,
        hello: Mapping[str, Any],
        *,
        clock: Clock | None = None,
        policy: Policy | None = None,
        metrics: MetricsSink | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.settings = settings
        self.hello = dict(hello)
        super().__init__(clock if clock is not None else WallClock())
        self.pool = pool
        self.refusals = Refusals(
            settings.hold_grace_s, settings.refused_for_s, settings.holder_lease_s
        )
        inner = policy if policy is not None else make_policy(config)
        self.policy = Refusing(inner)
        self.driver = RemoteDriver()
        self.inbox = Inbox(self.clock)
        self.leases = AgentLeases(self, settings.agent_lease_s)
        self.server = Server(socket_dir, self.handle)
        self.steps: list[Step] = []  # recorded steps with a decision (for benchmarks)
        self._lock = threading.Lock()
        self._agents: dict[int, AgentRecord] = {}
        self._generation: dict[int, int] = {}  # uid -> how often its agent's lease ran out
        self._restoring: dict[str, tuple[JobSpec, tuple[str, ...]]] = {}
        # user -> the nodes its agent said its holders run on, while restoring: a
        # trainer is restored only on nodes its own user's agent holds, and no other's.
        self._restore_held: dict[str, frozenset[str]] = {}
        self._snapshot: dict[str, tuple[str, ...]] = {}
        self._pool_now: tuple[str, ...] = ()

    # ---- running ----------------------------------------------------------------------
    def run(self) -> None:
        """Serve; after ``restore_grace_s`` build the loop from the agents' reports and
        run it until :meth:`request_stop`."""
        self.server.start()
        try:
            deadline = self.clock.now_s() + self.settings.restore_grace_s
            while not self.stopping and self.clock.now_s() < deadline:
                self.clock.wait_until(deadline)
            pool = self.until_answered(self._pool_read, self.settings.poll_interval_s)
            if pool is None:
                return
            self.start_loop(pool)
            assert self.loop is not None
            self.loop.run()
        finally:
            self.server.close()

    def _pool_read(self, now_s: float) -> tuple[str, ...] | None:
        """One try at the pool the loop starts on; None (and one line) while the
        scheduler cannot be read: an empty pool would take every trainer's nodes."""
        pool = self.pool.prime(now_s)
        if pool is None:
            log.warning(
                "the pool cannot be read yet: agents keep their nodes until it can "
                "(trying again in %g s)",
                self.settings.poll_interval_s,
            )
        return pool

    def start_loop(self, pool: tuple[str, ...] | None = None) -> Loop:
        """The loop on ``pool`` (else read now), restored from what the agents reported
        so far."""
        now_s = self.clock.now_s()
        if pool is None:
            pool = self.pool.prime(now_s) or ()
        with self._lock:
            free = set(pool) - self._contested_locked()
            trainers = []
            for job, nodes in self._restoring.values():
                held = self._restore_held.get(job.user, frozenset())
                mine = tuple(n for n in nodes if n in free and n in held)
                if len(mine) < len(nodes):
                    log.warning(
                        "restore: %s's trainer %s reported %d node(s) its agent does not hold "
                        "alone in the pool (not held, held by another user too, or gone): "
                        "restored on %d",
                        job.user,
                        job.id,
                        len(nodes) - len(mine),
                        len(mine),
                    )
                free -= set(mine)
                t = TrainerState(job, nodes=mine)
                for metric, curve in self._curves_of(job.id).items():
                    t.reported_curves[metric] = curve
                trainers.append(t)
            self._restoring.clear()
            self._restore_held.clear()
            state = LoopState(now_s=now_s, pool=pool, trainers=trainers)
            self.loop = Loop(
                [self.pool, self.inbox, self.leases],
                self.driver,
                self.clock,
                self.config,
                policy=self.policy,
                observer=StepObserver(self._after_step, self._metrics),
                state=state,
                keep_finished=False,  # the agents' stores have them
            )
            self._publish_locked()
        if trainers:
            kept = sum(len(t.nodes) for t in trainers)
            log.info("restored %d trainer(s) from their agents, on %d node(s)", len(trainers), kept)
        return self.loop

    def publish(self) -> None:
        with self._lock:
            self._publish_locked()

    def _after_step(self, step: Step) -> None:
        """After each recorded step: the node sets go out; decided steps are kept."""
        self.publish()
        if step.decided:
            self.steps.append(step)
            del self.steps[:-1000]

    def _metrics(self, latency_s: float | None) -> None:
        if self.metrics is not None:
            self.metrics.update(self.reading(), latency_s)

    def _publish_locked(self) -> None:
        assert self.loop is not None
        self._snapshot = {t.id: t.nodes for t in self.loop.trainers.values()}
        self._pool_now = tuple(self.loop.pool)
        self.refusals.assigned(self._snapshot, self.clock.now_s())

    def reading(self) -> Reading:
        """What the metrics export: the published split, by user, and the requests."""
        with self._lock:
            users: dict[str, UserReading] = {}
            for rec in self._agents.values():
                nodes = [self._snapshot.get(lid, ()) for lid in rec.ids.values()]
                running = sum(1 for n in nodes if n)
                users[rec.user] = UserReading(
                    running, len(nodes) - running, len({x for n in nodes for x in n})
                )
            allocated = len({n for nodes in self._snapshot.values() for n in nodes})
            pool_nodes, agents = len(self._pool_now), len(self._agents)
        scheduler = self.pool if isinstance(self.pool, CentrePool) else None  # else a test's
        return Reading(
            pool_nodes=pool_nodes,
            allocated_nodes=allocated,
            command_errors=scheduler.failed_reads if scheduler else {},
            pool_read_s=scheduler.read_s if scheduler else None,
            agents=AgentsReading(agents=agents, users=users, requests=self.server.outcomes()),
        )

    def _contested_locked(self) -> set[str]:
        """Nodes two users' agents both say they hold, at restore: given to neither's
        trainer until a decision (an agent's word alone cannot take another's nodes)."""
        seen: dict[str, str] = {}
        contested = set()
        for user, held in self._restore_held.items():
            for n in held:
                if seen.setdefault(n, user) != user:
                    contested.add(n)
        return contested

    def _curves_of(self, loop_id: str) -> dict[str, Curve]:
        for rec in self._agents.values():
            if loop_id in rec.curves:
                return rec.curves[loop_id]
        return {}

    # ---- requests ----------------------------------------------------------------------
    @staticmethod
    def alive(pid: int, started: int | None) -> bool:
        """Whether the agent that synced as ``pid`` still runs: that pid is a live
        process (not a zombie) that started when the agent did (a recycled pid has
        another start time, and a dead agent must not lock its user's next one out)."""
        return started is not None and process_start(pid) == started

    def handle(self, peer: Peer, request: Request) -> Mapping[str, Any]:
        if request.kind == protocol.HELLO:
            return self.hello
        if request.kind == protocol.SYNC:
            return self.sync(peer, SyncRequest.from_dict(request.body)).to_dict()
        if request.kind == protocol.STATUS:
            return self.status(peer, request.body)
        if request.kind == protocol.CANCEL:
            return self.cancel(peer, request.body)
        raise RequestRefused(f"unknown request kind {request.kind!r}")

    def sync(self, peer: Peer, request: SyncRequest) -> SyncReply:
        """An agent's report of its user's unfinished trainers; their nodes back."""
        now_s = self.clock.now_s()
        inputs: list[Input] = []
        with self._lock:
            rec = self._agents.get(peer.uid)
            if rec is None:
                rec = self._agents[peer.uid] = AgentRecord(
                    peer.uid,
                    peer.user,
                    account_of(peer.gid),
                    now_s,
                    peer.pid,
                    started=process_start(peer.pid),
                )
                log.info("agent of uid %d (%s) registered (pid %d)", peer.uid, peer.user, peer.pid)
            elif rec.pid != peer.pid:
                if self.alive(rec.pid, rec.started):
                    raise RequestRefused(
                        f"{peer.user} has an agent already (pid {rec.pid}): one agent per "
                        "user (stop the other, or use its state directory)"
                    )
                log.info("agent of uid %d (%s) is now pid %d", peer.uid, peer.user, peer.pid)
                rec.pid, rec.started = peer.pid, process_start(peer.pid)
            rec.last_s = now_s
            if self.loop is None:
                self._restore_held[rec.user] = frozenset(request.held or ())
            reported = {t.id: t for t in request.trainers}
            for t in request.trainers:
                inputs += self._update_trainer(rec, t)
            for local in [lid for lid in rec.ids if lid not in reported]:
                loop_id = rec.ids.pop(local)
                rec.curves.pop(loop_id, None)
                if self._restoring.pop(loop_id, None) is None:
                    inputs.append(Completion(loop_id))
            if request.held is not None and self._refused(rec, request, now_s):
                inputs.append(self.refusals.table())
            assignment = {
                local: self._snapshot[lid]
                for local, lid in rec.ids.items()
                if lid in self._snapshot
            }
            cancel, rec.cancels = tuple(sorted(rec.cancels)), set()
            for item in inputs:  # in the lock: a lease expiry cannot come in between
                self.inbox.put(item)
        return SyncReply(assignment, cancel, self.settings.sync_every_s)

    def _refused(self, rec: AgentRecord, request: SyncRequest, now_s: float) -> bool:
        """Whether this report refuses nodes to the agent's user (one line each)."""
        held = {*(request.held or ()), *(n for t in request.trainers for n in t.nodes)}
        new = self.refusals.held(rec.user, rec.ids.values(), held, now_s)
        if new:
            log.warning(
                "%s's agent has not held %s within %g s of their assignment: they go to "
                "other users for %g s",
                rec.user,
                ", ".join(new),
                self.refusals.hold_grace_s,
                self.refusals.refused_for_s,
            )
        return bool(new)

    def _update_trainer(self, rec: AgentRecord, t: TrainerReport) -> list[Input]:
        out: list[Input] = []
        loop_id = rec.ids.get(t.id)
        if loop_id is None:
            gen = self._generation.get(rec.uid, 0)
            loop_id = centre_id(rec.user, t.id) + (f"~{gen}" if gen else "")
            rec.ids[t.id] = loop_id
            job = t.job(loop_id, rec.user, rec.account)
            if self.loop is None:
                self._restoring[loop_id] = (job, t.nodes)
            else:
                out.append(Arrival(job))
            log.info("trainer %s of %s: %d to %d node(s)", loop_id, rec.user, t.n_min, t.n_max)
        known = rec.curves.setdefault(loop_id, {})
        for metric, curve in t.curves.items():
            if known.get(metric) != curve:
                known[metric] = curve
                if self.loop is not None:
                    out.append(CurveReport(loop_id, metric, curve))
        return out

    def expire_agents(self, now_s: float, lease_s: float) -> tuple[tuple[Input, ...], float]:
        """Withdraw the trainers of agents silent for ``lease_s``; (inputs, next check)."""
        inputs: list[Input] = []
        next_s = math.inf
        with self._lock:
            for uid, rec in list(self._agents.items()):
                due = rec.last_s + lease_s
                if due > now_s:
                    next_s = min(next_s, due)
                    continue
                del self._agents[uid]
                self._generation[uid] = self._generation.get(uid, 0) + 1
                inputs += [Cancel(lid) for lid in rec.ids.values()]
                log.warning(
                    "the agent of uid %d (%s) has not synced for %.0f s: its %d trainer(s) "
                    "are withdrawn and their nodes go to others until it comes back",
                    uid,
                    rec.user,
                    now_s - rec.last_s,
                    len(rec.ids),
                )
        return tuple(inputs), next_s

    def status(self, peer: Peer, body: Mapping[str, Any]) -> dict[str, Any]:
        """The pool and the trainers: the peer's in full, others' as their user's name
        and node count (as ``squeue`` shows everyone's jobs); one named trainer of
        another user is refused."""
        trainer = body.get("trainer")
        only = None
        if trainer is not None:
            if not isinstance(trainer, str):
                raise RequestRefused("'trainer' must be a trainer id")
            user, local = split_id(trainer, peer.user)
            _check_owner(peer, user, local, "see")
            only = local
        with self._lock:
            mine = self._agents.get(peer.uid)
            own = {lid: local for local, lid in (mine.ids.items() if mine else ())}
            trainers: list[dict[str, Any]] = []
            for lid, nodes in self._snapshot.items():
                if lid in own:
                    if only is None or own[lid] == only:
                        trainers.append({"id": lid, "user": peer.user, "nodes": list(nodes)})
                elif only is None:
                    trainers.append({"user": lid.split("/", 1)[0], "nodes": len(nodes)})
            queued = [lid for lid in own if lid not in self._snapshot]
            return {
                "pool": list(self._pool_now),
                "trainers": trainers,
                "queued": queued,
                "agent": None if mine is None else {"last_sync_s": mine.last_s},
                "restoring": self.loop is None,
            }

    def cancel(self, peer: Peer, body: Mapping[str, Any]) -> dict[str, Any]:
        """Cancel one of the peer's trainers: its agent is told at its next sync."""
        trainer = body.get("trainer")
        if not isinstance(trainer, str):
            raise RequestRefused("'trainer' must be a trainer id")
        user, local = split_id(trainer, peer.user)
        _check_owner(peer, user, local, "cancel")
        with self._lock:
            rec = self._agents.get(peer.uid)
            if rec is None:
                raise RequestRefused(
                    f"no agent of {peer.user} is registered: its trainers are not running "
                    "(bftrainer submit starts one)"
                )
            rec.cancels.add(local)
        log.info(
            "cancel of %s asked by uid %d (pid %d)", centre_id(user, local), peer.uid, peer.pid
        )
        return {"trainer": centre_id(user, local), "requested": True}


def _check_owner(peer: Peer, user: str, local: str, verb: str) -> None:
    if user != peer.user:
        raise RequestRefused(
            f"uid {peer.uid} ({peer.user}) may not {verb} {centre_id(user, local)}: "
            f"it belongs to {user}"
        )
