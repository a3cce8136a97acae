"""The live trainer driver: the core loop's hands on real elastic trainers.

The loop decides; this driver acts through each trainer's :class:`Launcher` (a detached
supervisor running Horovod or torchrun) and learns what happened from the trainer's
directory (``docs/trainers.md``: ``metrics.jsonl``, ``result.json``, ``exit.json``), so a
daemon that dies loses nothing: the trainers keep running, and a new daemon re-attaches
with :meth:`LiveDriver.attach`.

Costs are not simulated here: a rescale costs what it costs in real time, and the
samples a trainer reports are net of it. So ``rescale``/``preempt``/``cancel`` (a
simulated trainer's accounting) do nothing and cost 0, and ``advance`` returns the
samples the trainers reported since the last call.

**Orders: record, commit, then act.** The driver keeps no intents of its own. Inside the
loop's step (the daemon's transaction) :meth:`LiveDriver.record` writes what the step's
:class:`~bftrainer.loop.Orders` say of each trainer (its nodes, slots and state); after
the commit :meth:`LiveDriver.act` carries the same orders out: ends what a dead
supervisor left, starts supervisors, tells them their hosts, stops the cancelled, each
decided from the orders and what the driver knows of the supervisors. It returns what it
learnt (a supervisor's pid, a start that failed), which :meth:`LiveDriver.learn` records
at the next step. Every action is idempotent, so a daemon killed between the commit and
the action does it on restart (:meth:`LiveDriver.restore` returns the orders that bring
the trainers to their record): a supervisor already running for a trainer is adopted
(:meth:`Launcher.running_in`), never started twice. Every read of a trainer's files
survives a torn or bad line.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from bftrainer.daemon.exec_plan import LOCAL, ExecPlan
from bftrainer.daemon.live_orders import EndLeftovers, Launched, StartAgain, StartFailed, Stop
from bftrainer.daemon.live_reports import ReportReader
from bftrainer.daemon.slot_book import SlotBook, SlotMap, host_counts
from bftrainer.loop import Completion, CurveReport, NodeChange, Orders, Progress, TrainerState
from bftrainer.loop.jobs import job_of
from bftrainer.service.curves import LiveCurves
from bftrainer.state import Store, TrainerRow
from bftrainer.trainers import channel
from bftrainer.trainers.launch import restarts
from bftrainer.trainers.launch.base import Launcher, LaunchError, LaunchSpec, TrainerExit

log = logging.getLogger(__name__)

# Seconds a cancelled trainer's workers get to checkpoint before they are killed.
CANCEL_GRACE_S = 30.0
# A supervisor that died (kill -9, the OOM killer, a reboot) or gave up for a reason
# other than the trainer's script is started again from the trainer's checkpoint, within
# the trainer's one restart budget (trainers/launch/restarts.py), after
# RESTART_BACKOFF_S * 2**(k-1) seconds for the k-th restart since its last commit (the
# daemon's `restart_backoff_s`).
RESTART_BACKOFF_S = 10.0


class LiveDriver:
    """Drives real trainers (see the module docstring).

    ``exec_plan`` says how workers reach their nodes until a source says otherwise
    (``Orders.exec_plan``: the daemon's holders, with each poll; by default the nodes
    are this machine's names, run on locally);
    ``env`` is added to the supervisors' environment (e.g. ``SLURM_CONF``). With
    ``slots_per_node`` S > 1 trainers share nodes: a trainer's nodes list a node once
    per slot, and :attr:`book` keeps which slots of each node are whose.
    """

    def __init__(
        self,
        store: Store,
        state_dir: Path,
        *,
        exec_plan: ExecPlan = LOCAL,
        env: Mapping[str, str] | None = None,
        report_every_s: float = 5.0,
        slots_per_node: int = 1,
        restart_backoff_s: float = RESTART_BACKOFF_S,
    ) -> None:
        self.store = store
        self.restart_backoff_s = restart_backoff_s
        self.book = SlotBook(slots_per_node)
        self.trainers_dir = Path(state_dir) / "trainers"
        self.exec_plan = exec_plan
        self.env = dict(env or {})
        self.report_every_s = report_every_s
        self.launchers: dict[str, Launcher] = {}
        # Trainers whose supervisor is to be started again: when, and why.
        self._restarts: dict[str, tuple[float, str]] = {}
        self._reports: list[CurveReport | Completion] = []
        # The throughput curves the loop plans on: the replay's rule (bftrainer.service.curves).
        self.curves = LiveCurves(store)
        self.reader = ReportReader(store, self.curves)  # how far each one's reports are read
        # Node-count changes made by decisions since the start (logged "rescaled"), for
        # the daemon's metrics; starts and preemptions are not rescales.
        self.rescales = 0

    # ---- restore --------------------------------------------------------------------
    def restore(
        self, rows: Iterable[TrainerRow], held: set[str]
    ) -> tuple[list[TrainerState], list[str], Orders]:
        """The unfinished trainers ``rows`` as a new daemon's loop starts with them: each
        on its recorded nodes that are still ``held``, each slot at most once (the book
        takes back the slots it had, those that still exist), re-attached (:meth:`attach`);
        the slots given up, said in words; and the orders that bring the trainers to what
        the store records (what the earlier daemon committed and did not do: a start, the
        hosts, a cancelled trainer's stop), recorded here and carried out by :meth:`act`
        after the restore's commit."""
        allocations = self.store.current_allocations()
        trainers: list[TrainerState] = []
        lost: list[str] = []
        changes: list[NodeChange] = []
        for row in rows:
            alloc = allocations.get(row.id)
            stored = alloc.nodes if alloc is not None else ()
            slots, gone = self.book.restore(
                row.id, [n for n in stored if n in held], alloc.slots if alloc is not None else {}
            )
            nodes = tuple(sorted(n for n, s in slots.items() for _ in s))
            lost += [f"{k} of {row.id}'s slot(s) on {n}" for n, k in gone.items()]
            if self.attach(row, nodes):
                changes.append(NodeChange(row.id, nodes, "restore", len(stored)))
            job = self.curves.prior_job(job_of(row))
            trainers.append(
                TrainerState(
                    job, nodes=nodes, started_s=row.started_s, processed_samples=row.samples_done
                )
            )
        orders = Orders(time.time(), tuple(changes), driver=self.stop_cancelled())
        self.record(orders)
        return trainers, lost, orders

    def attach(self, row: TrainerRow, nodes: Sequence[str]) -> bool:
        """Re-attach to a trainer started by an earlier daemon, to give it ``nodes`` (its
        nodes that are still held): True when the restore's orders must bring it there
        (tell its supervisor its hosts; start it, decided and recorded but not done). A
        supervisor that ended meanwhile is reported at the next ``advance``."""
        trainer_dir = Path(row.trainer_dir) if row.trainer_dir else self.trainers_dir / row.id
        running = Launcher.running_in(trainer_dir)
        if running is not None:  # its supervisor runs, whatever the record says
            self._adopt(row, running)
            if row.supervisor != str(running.pid):
                self.store.set_launch(row.id, trainer_dir=trainer_dir, supervisor=str(running.pid))
            log.info("trainer %s: re-attached to its supervisor (pid %d)", row.id, running.pid)
            return True
        if row.trainer_dir is None:
            if nodes:  # decided and recorded, then the daemon stopped before the start
                log.info("trainer %s: starting it, as decided before the daemon stopped", row.id)
                return True
            return False
        if row.supervisor is None:
            # An earlier daemon counted its supervisor's death and stopped before starting
            # it again: the restart it decided is done now, not decided (counted) twice.
            self._restarts[row.id] = (time.time(), "its restart was pending")
            log.info("trainer %s: starting it again, as decided before the daemon stopped", row.id)
            return False
        try:
            launcher = Launcher.attach(trainer_dir)
        except LaunchError as exc:
            # Never started, or its directory is gone: start it again (bounded).
            self.launchers.pop(row.id, None)
            self._restart_later(row.id, f"cannot re-attach: {exc}", time.time())
            return False
        self._adopt(row, launcher)
        log.info("trainer %s: its supervisor ended while the daemon was away", row.id)
        return False  # advance() reads how it ended

    def _adopt(self, row: TrainerRow, launcher: Launcher) -> None:
        self.launchers[row.id] = launcher
        # Re-read the reports from the start: the store keeps only the latest figures.
        self.reader.from_start(row.id, row.samples_done)

    def stop_cancelled(self) -> tuple[Stop, ...]:
        """Orders to stop the supervisors of cancelled trainers that still run: an
        earlier daemon recorded the cancel and stopped before it stopped them."""
        stops = []
        for row in self.store.trainers(("cancelled",)):
            if row.trainer_dir is None or row.supervisor is None:
                continue
            launcher = Launcher.running_in(Path(row.trainer_dir))
            if launcher is not None:
                log.info("trainer %s: stopping it, cancelled before the daemon stopped", row.id)
                stops.append(Stop(row.id, launcher))
        return tuple(stops)

    # ---- the TrainerDriver interface ------------------------------------------------
    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        """Read every trainer's new reports; retire those whose supervisor ended.

        Progress and curves are read for every launched trainer (a trainer at zero
        nodes reports nothing new); an ended supervisor is noticed whether or not the
        trainer holds nodes now: a crash at zero nodes must also free it. What is due
        (a restart, a dead supervisor's leftovers to end) comes back as orders."""
        processed = 0.0
        running = {t.id: t for t in trainers}
        orders: list[object] = []
        for trainer_id, (at_s, _) in list(self._restarts.items()):
            if now_s >= at_s:
                del self._restarts[trainer_id]
                t = running.get(trainer_id)
                nodes = t.nodes if t is not None else ()
                self._decide_start(trainer_id, nodes)
                orders.append(StartAgain(trainer_id, nodes))
        for trainer_id, launcher in list(self.launchers.items()):
            if not launcher.trainer_dir.is_dir():
                # Deleted by hand: its checkpoint and reports are gone with it. Its
                # supervisor and workers may still run: stopped first (by PID, when this
                # step acts), so the new start does not train beside them on the same nodes.
                del self.launchers[trainer_id]
                orders.append(EndLeftovers(launcher))  # even if no restart is left to it
                why = f"its directory {launcher.trainer_dir} was deleted; it starts over"
                self._restart_later(trainer_id, why, now_s)
                continue
            ended = launcher.poll()
            gained, curves = self.reader.read(trainer_id, launcher.trainer_dir)
            self._reports += curves
            if trainer_id in running:  # the loop's progress counts running trainers
                running[trainer_id].processed_samples += gained
                processed += gained
            if ended is None:
                continue
            del self.launchers[trainer_id]
            if self._ended(trainer_id, launcher, ended, now_s):
                orders.append(EndLeftovers(launcher))  # whatever it left running here
        reports, self._reports = tuple(self._reports), []
        return Progress(processed, reports, tuple(orders))

    def _ended(self, trainer_id: str, launcher: Launcher, ended: TrainerExit, now_s: float) -> bool:
        """A supervisor is gone: the trainer is done, cancelled, failed by its own
        script, or is started again (bounded, with a backoff: True, its leftovers to end)."""
        result = channel.read_result(launcher.trainer_dir) if ended.state == "done" else None
        why = ended.reason or f"exit code {ended.returncode}"
        if ended.state == "done" and result is not None:
            self.store.update_progress(trainer_id, samples_done=int(result["samples"]))
            self._finish(trainer_id, "done", "")
        elif self.store.trainer(trainer_id).cancel_requested:
            self._finish(trainer_id, "cancelled", "cancelled")
        elif ended.state == "failed" and ended.cause == "script":
            self._fail(trainer_id, f"{why} (its own script; bftrainer logs {trainer_id})")
        elif ended.state == "failed" and ended.cause == "restarts":  # the one budget: spent
            self._fail(trainer_id, f"{why} (bftrainer logs {trainer_id})")
        else:
            return self._restart_later(trainer_id, why, now_s)
        return False

    def _restart_later(self, trainer_id: str, why: str, now_s: float) -> bool:
        """Count a restart and time it; False when none is left (it fails)."""
        try:
            restart = restarts.take(self.trainers_dir / trainer_id, why)
        except OSError as exc:  # it could not commit there either
            self._fail(trainer_id, f"cannot record its restart ({exc}); the last: {why}")
            return False
        if not restart.allowed:
            self._fail(trainer_id, f"{restart.gave_up()} (bftrainer logs {trainer_id})")
            return False
        delay_s = self.restart_backoff_s * 2 ** (restart.number - 1)
        self._restarts[trainer_id] = (now_s + delay_s, why)
        self.store.decide_restart(trainer_id)  # counted when decided: a failed start counts too
        log.warning(
            "trainer %s: %s; starting it again from its checkpoint in %.0f s (restart %d of %d)",
            trainer_id,
            why,
            delay_s,
            restart.number,
            restarts.MAX_RESTARTS,
        )
        return True

    def next_wakeup_s(self, trainers: Sequence[TrainerState], now_s: float) -> float:
        t = now_s + self.report_every_s if self.launchers else math.inf
        return min([t, *(at for at, _ in self._restarts.values())])

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        return 0.0  # real costs are paid in real time; the step's orders say the rest

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        return 0.0

    def cancel(self, trainer: TrainerState) -> None:
        pass

    # ---- the step's orders ------------------------------------------------------------
    def record(self, orders: Orders) -> None:
        """Record what ``orders`` say of each trainer (in the step's transaction): its
        nodes, slots and state, the rescales logged; nothing acts here."""
        if orders.exec_plan is not None:
            if not isinstance(orders.exec_plan, ExecPlan):
                raise TypeError(f"an exec plan, not {type(orders.exec_plan).__name__}")
            self.exec_plan = orders.exec_plan  # the pool source's word, from this step on
        starting = self._starts(orders)
        placed = False
        for c in orders.changes:
            tid = c.trainer_id
            if c.why == "cancel":
                self._restarts.pop(tid, None)
                self._record(tid, ())
                self._finish(tid, "cancelled", "cancelled")
            elif c.why == "preempt":
                self.book.assign(tid, c.nodes)  # its slots on the nodes gone are free
                if tid in self.launchers or tid in starting:
                    lost = c.before - len(c.nodes)
                    log.info(
                        "trainer %s lost %d %s: now on %d", tid, lost, self._unit, len(c.nodes)
                    )
                    self._decide_hosts(tid, c.nodes, say=False)
            elif c.why == "restore" and tid in starting:
                self._decide_start(tid, c.nodes)
            elif c.why == "restore":
                self._decide_hosts(tid, c.nodes)
            else:
                if c.why == "decide" and not placed:
                    # The decision's slots are given for all at once, the freed ones
                    # first (bftrainer.daemon.slot_book): the slot one frees is the one
                    # another gets.
                    self.book.place(orders.decided)
                    placed = True
                if tid in self.launchers or tid in starting:
                    self._decide_hosts(tid, c.nodes)
                elif tid in self._restarts:  # started again on its nodes when due
                    self._record(tid, c.nodes)
                elif c.nodes:
                    self._decide_start(tid, c.nodes)
                else:
                    self.book.release(tid)

    def act(self, orders: Orders) -> list[Launched | StartFailed]:
        """Carry ``orders`` out (after the step's commit; see the module docstring): end
        what dead supervisors left, stop the cancelled, then each changed trainer's
        start or hosts. Returns what it learnt, for :meth:`learn`."""
        learnt: list[Launched | StartFailed] = []
        for o in orders.driver:
            if isinstance(o, EndLeftovers):
                o.launcher.kill()
            elif isinstance(o, Stop):
                self._stop(o.trainer_id, o.launcher)
        final = orders.final_nodes()
        starting = self._starts(orders)
        again = {o.trainer_id: o.nodes for o in orders.driver if isinstance(o, StartAgain)}
        for tid in orders.cancelled:
            launcher = self.launchers.pop(tid, None)
            if launcher is not None:
                self._stop(tid, launcher)
        for tid, nodes in final.items():
            if tid in orders.cancelled or tid in again:
                continue
            if tid in self.launchers:
                self._tell_hosts(tid, self.launchers[tid], nodes)
            elif tid in starting:
                self._start(tid, nodes, learnt, restart=False)
        for tid, nodes in again.items():
            self._start(tid, final.get(tid, nodes), learnt, restart=True)
        return learnt

    def learn(self, learnt: Sequence[object]) -> None:
        """Record what the last :meth:`act` learnt: at the next step, in its
        transaction, or at once at the daemon's exit."""
        for fact in learnt:
            if isinstance(fact, Launched):
                self.store.set_launch(
                    fact.trainer_id, trainer_dir=fact.trainer_dir, supervisor=fact.pid
                )
            elif isinstance(fact, StartFailed) and fact.again:
                self._restart_later(fact.trainer_id, fact.why, time.time())
            elif isinstance(fact, StartFailed):
                self._fail(fact.trainer_id, fact.why)

    @staticmethod
    def _stop(trainer_id: str, launcher: Launcher) -> None:
        """The supervisor checkpoints and stops in the background; the loop goes on."""
        threading.Thread(
            target=launcher.stop, args=(CANCEL_GRACE_S,), name=f"stop-{trainer_id}", daemon=True
        ).start()

    # ---- helpers --------------------------------------------------------------------
    @property
    def _unit(self) -> str:
        """What a trainer's node list counts, for the log."""
        return "node(s)" if self.book.slots_per_node == 1 else "slot(s)"

    def _plan(self, trainer_id: str, nodes: tuple[str, ...]) -> ExecPlan:
        """How the trainer's workers run on ``nodes``: the daemon's plan, and with
        shared nodes the trainer's slots there (given now, kept from before)."""
        slots = self.book.assign(trainer_id, nodes)
        plan = self.exec_plan.on(nodes)
        if self.book.slots_per_node == 1:
            return plan
        return replace(plan, slots=slots, slots_per_node=self.book.slots_per_node)

    def _record(self, trainer_id: str, nodes: tuple[str, ...]) -> None:
        """Record the trainer's nodes now, and with shared nodes its slots there."""
        slots: SlotMap | None = None
        if not nodes:
            self.book.release(trainer_id)
        elif self.book.slots_per_node > 1:
            slots = self.book.assign(trainer_id, nodes)
        self.store.record_allocation(trainer_id, nodes, slots=slots)

    def _decide_start(self, trainer_id: str, nodes: tuple[str, ...]) -> None:
        """Record the trainer's nodes and state; act() starts its supervisor there."""
        self._record(trainer_id, nodes)
        row = self.store.trainer(trainer_id)
        if not row.finished:
            self.store.set_trainer_state(trainer_id, "running" if nodes else "waiting")

    def _starts(self, orders: Orders) -> set[str]:
        """The trainers whose supervisor ``orders`` start: a restart come due, or nodes
        for one that has no supervisor and waits for no restart. The same at
        :meth:`record` and :meth:`act` (nothing between them changes what it reads)."""
        starting = {o.trainer_id for o in orders.driver if isinstance(o, StartAgain)}
        for c in orders.changes:
            tid = c.trainer_id
            if not c.nodes or tid in self.launchers or tid in starting:
                continue
            if c.why == "restore" or (c.why in ("decide", "evict") and tid not in self._restarts):
                starting.add(tid)
        return starting

    def _start(
        self,
        trainer_id: str,
        nodes: tuple[str, ...],
        learnt: list[Launched | StartFailed],
        *,
        restart: bool,
    ) -> None:
        """Start the trainer's supervisor on ``nodes`` (those with a holder now), or adopt
        the one that already runs there (a restart of the daemon redoing this start); a
        restart resumes from the trainer's checkpoint in its directory."""
        row = self.store.trainer(trainer_id)
        trainer_dir = self.trainers_dir / trainer_id
        args = list(row.args)
        if math.isfinite(row.work_samples):
            args += ["--work-samples", str(row.work_samples)]
        spec = LaunchSpec(
            trainer_id=trainer_id,
            script=Path(row.script),
            args=tuple(args),
            trainer_dir=trainer_dir,
            backend=row.backend,
            n_min=row.n_min,
            n_max=row.n_max,
            env=self.env,
        )
        try:
            trainer_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            plan = self._plan(trainer_id, nodes)
            hosts = self._reachable(trainer_id, plan, nodes)
            plan.write(trainer_dir)
            launcher = Launcher.running_in(trainer_dir)
            if launcher is not None:
                launcher.set_hosts(host_counts(hosts))
            else:
                launcher = Launcher.start(spec, host_counts(hosts))
        except OSError as exc:  # the file system, not the trainer: try again (bounded)
            learnt.append(StartFailed(trainer_id, f"cannot start: {exc}", again=True))
            return
        except (LaunchError, channel.ChannelError) as exc:
            learnt.append(StartFailed(trainer_id, f"cannot start: {exc}", again=False))
            return
        self.launchers[trainer_id] = launcher
        if not restart:  # a restart reads on from where the dead supervisor's reports were
            self.reader.from_start(trainer_id, row.samples_done)
        elif not (trainer_dir / channel.METRICS).exists():  # its directory was deleted
            self.reader.from_start(trainer_id)
        learnt.append(Launched(trainer_id, trainer_dir, str(launcher.pid)))
        if restart:
            log.info(
                "trainer %s started again (restart %d) on %d %s, from its checkpoint",
                trainer_id,
                row.restarts,
                len(hosts),
                self._unit,
            )
        else:
            log.info(
                "trainer %s started on %d %s: %s", trainer_id, len(hosts), self._unit, _names(hosts)
            )

    def _reachable(
        self, trainer_id: str, plan: ExecPlan, nodes: tuple[str, ...]
    ) -> tuple[str, ...]:
        """``nodes`` whose holder is there; the others are said once and left out (the
        pool source reports their departure at its next poll)."""
        hosts = plan.reachable(nodes)
        if len(hosts) < len(nodes):
            lost = sorted(set(nodes) - set(hosts))
            log.warning(
                "trainer %s: the holder of %s ended before the trainer could use it; "
                "going on with %d node(s)",
                trainer_id,
                _names(lost),
                len(hosts),
            )
        return hosts

    def _decide_hosts(self, trainer_id: str, nodes: tuple[str, ...], *, say: bool = True) -> None:
        """Record the trainer's nodes and state; act() tells its supervisor (or starts
        it there, when its start is due). ``say``: log the rescale (a preemption has
        said it already)."""
        before = self.store.current_allocation(trainer_id)
        self._record(trainer_id, nodes)
        row = self.store.trainer(trainer_id)
        if not row.finished:
            self.store.set_trainer_state(trainer_id, "running" if nodes else "waiting")
        if say and tuple(before) != tuple(nodes):
            self.rescales += 1
            log.info(
                "trainer %s rescaled: %d -> %d %s%s",
                trainer_id,
                len(before),
                len(nodes),
                self._unit,
                "" if nodes else " (waiting for nodes)",
            )

    def _tell_hosts(self, trainer_id: str, launcher: Launcher, nodes: tuple[str, ...]) -> None:
        """Tell the supervisor its hosts: exec plan first, so new hosts are reachable."""
        hosts = nodes
        try:
            if nodes:
                plan = self._plan(trainer_id, nodes)
                hosts = self._reachable(trainer_id, plan, nodes)
                plan.write(launcher.trainer_dir)
            launcher.set_hosts(host_counts(hosts))
        except FileNotFoundError:
            if launcher.trainer_dir.is_dir():
                raise
            # its directory was deleted meanwhile: the next look starts it over

    def _finish(self, trainer_id: str, state: str, reason: str) -> None:
        self.reader.forget(trainer_id)  # the store keeps its figures
        row = self.store.trainer(trainer_id)
        if not row.finished:
            self.store.set_trainer_state(trainer_id, state, reason=reason)
        self._record(trainer_id, ())
        if state != "cancelled":
            self._reports.append(Completion(trainer_id))
        if state == "done":
            log.info(
                "trainer %s done: %d samples",
                trainer_id,
                self.store.trainer(trainer_id).samples_done,
            )
        else:
            log.info("trainer %s %s", trainer_id, state)

    def _fail(self, trainer_id: str, reason: str) -> None:
        self.launchers.pop(trainer_id, None)
        self.reader.forget(trainer_id)  # the store keeps its figures
        row = self.store.trainer(trainer_id)
        if not row.finished:
            self.store.set_trainer_state(trainer_id, "failed", reason=reason)
        self._record(trainer_id, ())
        self._reports.append(Completion(trainer_id))
        log.warning("trainer %s failed: %s", trainer_id, reason)


def _names(nodes: Sequence[str]) -> str:
    """``node1,node2``; with shared nodes ``node1:2`` for two slots of node1."""
    return ",".join(h if n == 1 else f"{h}:{n}" for h, n in host_counts(nodes))
