"""The daemon's service: the core loop on the wall clock, on the nodes its holders keep.

:class:`Daemon` plugs three parts into :class:`bftrainer.loop.Loop` (the loop the replay
runs): the :class:`~bftrainer.daemon.held_pool.HeldPool` (the pool source), the
:class:`~bftrainer.daemon.queue.SubmissionQueue` (trainers submitted and cancels
requested) and the :class:`~bftrainer.daemon.live_driver.LiveDriver` (starts and rescales the real
trainers); in centre mode a :class:`~bftrainer.daemon.centre_link.CentreLink` too.

Everything the daemon knows is in the SQLite store of its state directory, written
before it acts: each step of the loop is one transaction (``store.transaction``), and the
driver and the held pool act on it only after it commits (``bftrainer.loop.core``).
After a kill -9, :meth:`Daemon.restore` reconciles the holders with the scheduler
(unknown ones are cancelled, ended ones dropped), re-attaches to the trainers'
supervisors (which never stopped), rebuilds the loop's state from the records and does
what the killed daemon decided and did not do: the holder ends and leftovers of its
kept orders not marked done (``StepActuator.redo``), the trainers' starts, hosts and
stops from their record (``LiveDriver.restore``). On
SIGTERM the daemon stops taking work: it releases the holders no trainer uses and
exits, leaving running trainers and their holders as they are for the next start.

A bad scheduler reply never stops the daemon: the monitor keeps the last good pool
(stale), a failed holder status keeps the last known holders, a refused holder is
logged and tried again at a later poll.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bftrainer.daemon.actuator import StepActuator
from bftrainer.daemon.centre_link import CentreLink
from bftrainer.daemon.config import GRES, DaemonConfig
from bftrainer.daemon.gpu_slots import GpuSlotGate, GresError, slots_from_gpus
from bftrainer.daemon.held_pool import HeldPool
from bftrainer.daemon.left_running import say_left_running
from bftrainer.daemon.live_driver import LiveDriver
from bftrainer.daemon.queue import UNFINISHED, SubmissionQueue
from bftrainer.daemon.slot_book import SlotBook
from bftrainer.holders.base import HolderError, Holders
from bftrainer.idle_monitor.runner import CommandError
from bftrainer.idle_monitor.source import LivePoolSource
from bftrainer.loop import Loop, LoopState, Orders, Policy, Reader, Source, TrainerState, WallClock
from bftrainer.policies.registry import MilpPolicy, make_policy
from bftrainer.service.base import LiveService, StepObserver
from bftrainer.service.reading import HeldReading, MetricsSink, Reading
from bftrainer.state import Store

log = logging.getLogger(__name__)


class Daemon(LiveService):
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
        super().__init__(WallClock())
        self.pool = HeldPool(
            monitor,
            holders,
            store,
            config.poll_interval_s,
            lease_dir=state_dir / "leases",
            lease_s=config.holder_lease_s,
            follow_assignment=centre is not None,
        )
        # A centre agent: the allocator decides (centre.policy follows it), the link
        # reports this user's trainers to it; None: this daemon decides alone.
        self.centre = centre
        self.driver = LiveDriver(
            store,
            state_dir,
            # The holders recorded now; each poll hands the driver the plan anew.
            exec_plan=self.pool.exec_plan(),
            env=env,
            report_every_s=config.report_every_s,
            slots_per_node=config.slots_per_node,
            restart_backoff_s=config.restart_backoff_s,
        )
        self.queue = SubmissionQueue(
            store, curves=self.driver.curves, promise=config.search_promise
        )
        self.actuator = StepActuator(self.driver, self.pool, store)

    def restore(self) -> LoopState | None:
        """The loop's state from the store, after reconciling holders with the scheduler
        and re-attaching to the trainers that still run; None if asked to stop before
        the scheduler answered."""
        now_s = self._sync_holders_at_start()
        if now_s is None:
            return None
        learnt = self.actuator.redo()  # what a killed daemon committed and did not do
        with self.store.transaction():
            self.actuator.learn(learnt)
            state, orders = self._restore_trainers(now_s)
        learnt = self.driver.act(orders)  # what the earlier daemon decided and did not do
        with self.store.transaction():
            self.driver.learn(learnt)
        return state

    def _restore_trainers(self, now_s: float) -> tuple[LoopState, Orders]:
        """The loop's state from the store (in one transaction): the trainers on their
        nodes that are still held; the orders that bring them there."""
        running = sorted(h.node for h in self.store.holders(live_only=True) if h.state == "running")
        self.pool.usable = set(running)
        trainers, lost, orders = self.driver.restore(self.store.trainers(UNFINISHED), set(running))
        self._note_slot_count(trainers, lost)
        self.queue.known = {t.id for t in trainers}
        if trainers:
            log.info("restored %d trainer(s) on %d held node(s)", len(trainers), len(running))
        return LoopState(now_s=now_s, pool=tuple(running), trainers=trainers), orders

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
        return self.until_answered(self._slots_read, self.pool.poll_interval_s)

    def _slots_read(self, now_s: float) -> int | None:
        """One try of :meth:`slots_at_start`: S, or None if the scheduler did not answer."""
        try:
            self.monitor.poll()  # a failed read is its one line
        except (CommandError, ValueError) as exc:
            log.warning("GPU counts not read at start: %s", exc)
        if self.monitor.last_reading is None:
            return None
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
            "slots per node: %d, the GPU count of %d of the %d node(s) read", slots, fits, read
        )
        return slots

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
        publish = self._publish_metrics if self.metrics is not None else None
        sources: list[Source] = [self.pool, self.queue]
        readers: list[Reader] = [self.pool]  # asked before each step's transaction
        # The daemon's own policy; in centre mode the allocator's decisions instead.
        policy = own_policy(self.config, self.queue)
        if self.centre is not None:
            sources.append(self.centre)
            readers.append(self.centre)
            policy = self.centre.policy
        self.loop = Loop(
            sources,
            self.driver,
            self.clock,
            self.config,
            policy=policy,
            observer=StepObserver(lambda step: self.check_pool(), publish),
            state=state,
            keep_finished=False,  # the store has them
            transaction=self.store.transaction,
            readers=readers,
            planner=self.pool,
            actuator=self.actuator,
        )
        if self.centre is not None:
            self.centre.attach(self.store)
        self._publish_metrics(None)
        try:
            self.loop.run()
        finally:
            self._shutdown()
            self._publish_metrics(None)

    def reading(self) -> Reading:
        """The daemon's figures now (see :class:`~bftrainer.service.reading.Reading`)."""
        view = self.pool.view
        last = self.monitor.last_reading
        trainers = self.loop.trainers.values() if self.loop is not None else ()
        counts = self.pool.counts
        return Reading(
            pool_nodes=len(view.pool) if view is not None else 0,
            allocated_nodes=len({n for t in trainers for n in t.nodes}),
            command_errors=dict(counts.errors + self.monitor.failed_reads),
            pool_read_s=last.time_s if last is not None else None,
            held=HeldReading(
                held_nodes=sum(h.state == "running" for h in self.store.holders(live_only=True)),
                trainers=self.store.trainer_counts(),
                holders=replace(counts, errors=Counter(counts.errors)),
                rescales=self.driver.rescales,
                holders_failing=self.pool.backoff.summary(),
            ),
        )

    def _publish_metrics(self, latency_s: float | None) -> None:
        if self.metrics is not None:
            self.metrics.update(self.reading(), latency_s)

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
        return self.until_answered(self._holders_read, self.pool.poll_interval_s)

    def _holders_read(self, now_s: float) -> float | None:
        """One try of :meth:`_sync_holders_at_start`: the time read, or None."""
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
            return None

    def _shutdown(self) -> None:
        """Stop taking work: cancel holders that no trainer runs on; leave the rest."""
        try:
            with self.store.transaction():  # what the last step's actions learnt
                if self.loop is not None:
                    self.loop.flush()
            self._release_spare()  # recorded at once
        except (sqlite3.Error, OSError) as exc:
            if not state_unwritable(exc):
                raise
            log.warning("holders not released at exit: the state cannot be written (%s)", exc)
        log.info("daemon stopped; %d trainer(s) left running", len(self.driver.launchers))
        say_left_running(self.store, self.driver.launchers)

    def _release_spare(self) -> None:
        allocated = {n for a in self.store.current_allocations().values() for n in a.nodes}
        spare = [h.job_id for h in self.store.holders(live_only=True) if h.node not in allocated]
        if spare:
            self.pool.cancel(spare, "released at exit")


def own_policy(config: DaemonConfig, queue: SubmissionQueue) -> Policy:
    """The policy a daemon decides with alone (``make_policy``); with ``search_promise``
    on, milp weighs each trainer by the promise its campaign marked in the store, which
    ``queue`` reads at each step (as the replay weighs its search's trials)."""
    policy = make_policy(config)
    if isinstance(policy, MilpPolicy) and config.search_promise != 1:
        policy = replace(policy, weights=queue.weight)
    return policy


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
