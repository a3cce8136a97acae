"""The live trainer driver: the core loop's hands on real elastic trainers.

The loop decides; this driver acts through each trainer's :class:`Launcher` (a detached
supervisor running Horovod or torchrun) and learns what happened from the trainer's
directory (``docs/trainers.md``: ``metrics.jsonl``, ``result.json``, ``exit.json``), so a
daemon that dies loses nothing: the trainers keep running, and a new daemon re-attaches
with :meth:`LiveDriver.attach`.

Costs are not simulated here: a rescale costs what it costs in real time, and the
samples a trainer reports are net of it. So ``rescale``/``preempt`` return 0 and
``advance`` returns the samples the trainers reported since the last call.

**Decide, commit, then act.** Inside the loop's step (the daemon's transaction) the driver
only records what it decided: each trainer's nodes and state. :meth:`LiveDriver.act`
carries it out after the commit: starts supervisors, tells them their hosts, stops the
cancelled, ends what a dead supervisor left. What an action learns (a supervisor's pid, a
start that failed) is recorded at the next step. Every action is idempotent, so a daemon
killed between the commit and the action does it on restart: a supervisor already
running for a trainer is adopted (:meth:`Launcher.running_in`), never started twice.
Every read of a trainer's files survives a torn or bad line.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from bftrainer.exec_plan import LOCAL, ExecPlan
from bftrainer.live_curves import LiveCurves, job_of
from bftrainer.loop import Completion, CurveReport, Progress, TrainerState
from bftrainer.slots import SlotBook, SlotMap, host_counts
from bftrainer.state import Store, TrainerRow
from bftrainer.trainers import channel
from bftrainer.trainers.launch import restarts
from bftrainer.trainers.launch.base import Launcher, LaunchError, LaunchSpec, TrainerExit
from bftrainer.trainers.metrics import MetricsRecord, MetricsRecordError

log = logging.getLogger(__name__)

# Seconds a cancelled trainer's workers get to checkpoint before they are killed.
CANCEL_GRACE_S = 30.0
# A supervisor that died (kill -9, the OOM killer, a reboot) or gave up for a reason
# other than the trainer's script is started again from the trainer's checkpoint, within
# the trainer's one restart budget (trainers/launch/restarts.py), after
# RESTART_BACKOFF_S * 2**(k-1) seconds for the k-th restart since its last commit (the
# daemon's `restart_backoff_s`).
RESTART_BACKOFF_S = 10.0


# The actions that start a supervisor (act()).
STARTS = ("start", "restart")


class LiveDriver:
    """Drives real trainers (see the module docstring).

    ``exec_plan`` says how workers reach their nodes until a source says otherwise
    (:meth:`use_exec_plan`: the daemon's holders, with each poll; by default the nodes
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
        self._offsets: dict[str, int] = {}
        self._samples: dict[str, int] = {}
        self._reports: list[CurveReport | Completion] = []
        # The throughput curves the loop plans on: the replay's rule (bftrainer.live_curves).
        self.curves = LiveCurves(store)
        # Node-count changes made by decisions since the start (logged "rescaled"), for
        # the daemon's metrics; starts and preemptions are not rescales.
        self.rescales = 0
        # What the step decided for each trainer, carried out by act() after the commit:
        # "hosts" (tell its supervisor), "start" or "restart" (start its supervisor),
        # "stop" (cancelled); the nodes to act on; supervisors to stop or end.
        self._due: dict[str, str] = {}
        self._intended: dict[str, tuple[str, ...]] = {}
        self._stopping: dict[str, Launcher] = {}
        self._kills: list[Launcher] = []
        # What act() learnt, recorded at the next step (advance), in its transaction.
        self._learnt: list[Callable[[], object]] = []

    # ---- restore --------------------------------------------------------------------
    def restore(
        self, rows: Iterable[TrainerRow], held: set[str]
    ) -> tuple[list[TrainerState], list[str]]:
        """The unfinished trainers ``rows`` as a new daemon's loop starts with them: each
        on its recorded nodes that are still ``held``, each slot at most once (the book
        takes back the slots it had, those that still exist), re-attached (:meth:`attach`);
        the slots given up, said in words. Cancelled trainers still running are stopped.
        What the earlier daemon decided and did not do is done by the next :meth:`act`."""
        allocations = self.store.current_allocations()
        trainers: list[TrainerState] = []
        lost: list[str] = []
        for row in rows:
            alloc = allocations.get(row.id)
            stored = alloc.nodes if alloc is not None else ()
            slots, gone = self.book.restore(
                row.id, [n for n in stored if n in held], alloc.slots if alloc is not None else {}
            )
            nodes = tuple(sorted(n for n, s in slots.items() for _ in s))
            lost += [f"{k} of {row.id}'s slot(s) on {n}" for n, k in gone.items()]
            self.attach(row, nodes)
            job = self.curves.prior_job(job_of(row))
            trainers.append(
                TrainerState(
                    job, nodes=nodes, started_s=row.started_s, processed_samples=row.samples_done
                )
            )
        self.stop_cancelled()
        return trainers, lost

    def attach(self, row: TrainerRow, nodes: Sequence[str]) -> None:
        """Re-attach to a trainer started by an earlier daemon; give it ``nodes`` (its
        nodes that are still held). A supervisor that ended meanwhile is reported at the
        next ``advance``; a start the earlier daemon decided but did not do (or did and
        did not record) is done by the next :meth:`act`."""
        trainer_dir = Path(row.trainer_dir) if row.trainer_dir else self.trainers_dir / row.id
        running = Launcher.running_in(trainer_dir)
        if running is not None:  # its supervisor runs, whatever the record says
            self._adopt(row, running)
            if row.supervisor != str(running.pid):
                self.store.set_launch(row.id, trainer_dir=trainer_dir, supervisor=str(running.pid))
            self._decide_hosts(row.id, tuple(nodes))
            log.info("trainer %s: re-attached to its supervisor (pid %d)", row.id, running.pid)
            return
        if row.trainer_dir is None:
            if nodes:  # decided and recorded, then the daemon stopped before the start
                log.info("trainer %s: starting it, as decided before the daemon stopped", row.id)
                self._decide_start(row.id, tuple(nodes))
            return
        if row.supervisor is None:
            # An earlier daemon counted its supervisor's death and stopped before starting
            # it again: the restart it decided is done now, not decided (counted) twice.
            self._restarts[row.id] = (time.time(), "its restart was pending")
            log.info("trainer %s: starting it again, as decided before the daemon stopped", row.id)
            return
        try:
            launcher = Launcher.attach(trainer_dir)
        except LaunchError as exc:
            # Never started, or its directory is gone: start it again (bounded).
            self.launchers.pop(row.id, None)
            self._restart_later(row.id, None, f"cannot re-attach: {exc}", time.time())
            return
        self._adopt(row, launcher)
        log.info("trainer %s: its supervisor ended while the daemon was away", row.id)
        # advance() reads how it ended

    def _adopt(self, row: TrainerRow, launcher: Launcher) -> None:
        self.launchers[row.id] = launcher
        # Re-read the reports from the start: the store keeps only the latest figures.
        self._samples[row.id] = row.samples_done
        self._offsets[row.id] = 0

    def stop_cancelled(self) -> None:
        """Stop the supervisors of cancelled trainers that still run: an earlier daemon
        recorded the cancel and stopped before it stopped them (at restore)."""
        for row in self.store.trainers(("cancelled",)):
            if row.trainer_dir is None or row.supervisor is None:
                continue
            launcher = Launcher.running_in(Path(row.trainer_dir))
            if launcher is not None:
                log.info("trainer %s: stopping it, cancelled before the daemon stopped", row.id)
                self._stopping[row.id] = launcher
                self._due[row.id] = "stop"

    # ---- the TrainerDriver interface ------------------------------------------------
    def place(self, changes: Mapping[str, tuple[str, ...]]) -> None:
        """The decision's new node sets, before the loop hands them out one trainer at a
        time: slots are given for all at once, the freed ones first (bftrainer.slots)."""
        self.book.place(changes)

    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        """Read every trainer's new reports; retire those whose supervisor ended.

        Progress and curves are read for every launched trainer (a trainer at zero
        nodes reports nothing new); an ended supervisor is noticed whether or not the
        trainer holds nodes now: a crash at zero nodes must also free it."""
        self.flush()  # what the last step's actions learnt
        processed = 0.0
        running = {t.id: t for t in trainers}
        for trainer_id, (at_s, _) in list(self._restarts.items()):
            if now_s >= at_s:
                del self._restarts[trainer_id]
                t = running.get(trainer_id)
                self._decide_start(trainer_id, t.nodes if t is not None else (), restart=True)
        for trainer_id, launcher in list(self.launchers.items()):
            if not launcher.trainer_dir.is_dir():
                # Deleted by hand: its checkpoint and reports are gone with it. Its
                # supervisor and workers may still run: stopped first (by PID, when this
                # step acts), so the new start does not train beside them on the same nodes.
                del self.launchers[trainer_id]
                self._kills.append(launcher)  # even if no restart is left to it
                why = f"its directory {launcher.trainer_dir} was deleted; it starts over"
                self._restart_later(trainer_id, launcher, why, now_s)
                continue
            ended = launcher.poll()
            gained = self._read_reports(trainer_id, launcher.trainer_dir)
            if trainer_id in running:  # the loop's progress counts running trainers
                running[trainer_id].processed_samples += gained
                processed += gained
            if ended is None:
                continue
            del self.launchers[trainer_id]
            self._ended(trainer_id, launcher, ended, now_s)
        reports, self._reports = tuple(self._reports), []
        return Progress(processed, reports)

    def _ended(self, trainer_id: str, launcher: Launcher, ended: TrainerExit, now_s: float) -> None:
        """A supervisor is gone: the trainer is done, cancelled, failed by its own
        script, or is started again (bounded, with a backoff)."""
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
            self._restart_later(trainer_id, launcher, why, now_s)

    def _restart_later(
        self, trainer_id: str, launcher: Launcher | None, why: str, now_s: float
    ) -> None:
        try:
            restart = restarts.take(self.trainers_dir / trainer_id, why)
        except OSError as exc:  # it could not commit there either
            self._fail(trainer_id, f"cannot record its restart ({exc}); the last: {why}")
            return
        if not restart.allowed:
            self._fail(trainer_id, f"{restart.gave_up()} (bftrainer logs {trainer_id})")
            return
        if launcher is not None:
            self._kills.append(launcher)  # whatever the dead supervisor left running here
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

    def next_wakeup_s(self, trainers: Sequence[TrainerState], now_s: float) -> float:
        t = now_s + self.report_every_s if self.launchers else math.inf
        return min([t, *(at for at, _ in self._restarts.values())])

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        if trainer.id in self.launchers or self._due.get(trainer.id) in STARTS:
            self._decide_hosts(trainer.id, nodes)
        elif trainer.id in self._restarts:  # started again on its nodes when due
            self._record(trainer.id, nodes)
        elif nodes:
            self._decide_start(trainer.id, nodes)
        else:
            self.book.release(trainer.id)
        return 0.0

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        self.book.assign(trainer.id, trainer.nodes)  # its slots on the nodes gone are free
        if trainer.id in self.launchers or self._due.get(trainer.id) in STARTS:
            log.info(
                "trainer %s lost %d %s: now on %d",
                trainer.id,
                old_count - len(trainer.nodes),
                self._unit,
                len(trainer.nodes),
            )
            self._decide_hosts(trainer.id, trainer.nodes, say=False)
        return 0.0

    def cancel(self, trainer: TrainerState) -> None:
        self._restarts.pop(trainer.id, None)
        self._due.pop(trainer.id, None)
        launcher = self.launchers.pop(trainer.id, None)
        self._record(trainer.id, ())
        if launcher is not None:
            # The supervisor checkpoints and stops in the background (act); the loop goes on.
            self._stopping[trainer.id] = launcher
            self._due[trainer.id] = "stop"
        self._finish(trainer.id, "cancelled", "cancelled")

    # ---- after the commit -------------------------------------------------------------
    def use_exec_plan(self, plan: object) -> None:
        """The pool source's word on how workers reach its nodes, from this step on."""
        if not isinstance(plan, ExecPlan):
            raise TypeError(f"an exec plan, not {type(plan).__name__}")
        self.exec_plan = plan

    def act(self, now_s: float) -> None:
        """Carry out what the step decided (see the module docstring): end what dead
        supervisors left, then each trainer's start, hosts or stop."""
        kills, self._kills = self._kills, []
        for launcher in kills:
            launcher.kill()
        due, self._due = self._due, {}
        intended, self._intended = self._intended, {}
        for trainer_id, what in due.items():
            if what == "stop":
                launcher = self._stopping.pop(trainer_id)
                threading.Thread(
                    target=launcher.stop,
                    args=(CANCEL_GRACE_S,),
                    name=f"stop-{trainer_id}",
                    daemon=True,
                ).start()
            elif what in STARTS:
                self._start(trainer_id, intended.get(trainer_id, ()), restart=what == "restart")
            elif trainer_id in self.launchers:
                self._tell_hosts(trainer_id, self.launchers[trainer_id], intended[trainer_id])

    def flush(self) -> None:
        """Record what the last actions learnt: at the next step's ``advance``, or at
        once at the daemon's exit."""
        learnt, self._learnt = self._learnt, []
        for record in learnt:
            record()

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

    def _decide_start(
        self, trainer_id: str, nodes: tuple[str, ...], *, restart: bool = False
    ) -> None:
        """Record the trainer's nodes and state; act() starts its supervisor there."""
        self._record(trainer_id, nodes)
        row = self.store.trainer(trainer_id)
        if not row.finished:
            self.store.set_trainer_state(trainer_id, "running" if nodes else "waiting")
        restart = restart or self._due.get(trainer_id) == "restart"
        self._due[trainer_id] = "restart" if restart else "start"
        self._intended[trainer_id] = nodes

    def _start(self, trainer_id: str, nodes: tuple[str, ...], *, restart: bool) -> None:
        """Start the trainer's supervisor on ``nodes`` (those with a holder now), or adopt
        the one that already runs there (a restart of the daemon redoing this start); a
        restart resumes from the trainer's checkpoint in its directory."""
        row = self.store.trainer(trainer_id)
        trainer_dir = self.trainers_dir / trainer_id
        args = list(row.args)
        if row.work_samples is not None:
            args += ["--work-samples", str(row.work_samples)]
        spec = LaunchSpec(
            trainer_id=trainer_id,
            script=Path(row.script),
            args=tuple(args),
            trainer_dir=trainer_dir,
            backend=row.backend,
            min_hosts=row.min_nodes,
            max_hosts=row.max_nodes,
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
            why = f"cannot start: {exc}"
            self._learnt.append(lambda: self._restart_later(trainer_id, None, why, time.time()))
            return
        except (LaunchError, channel.ChannelError) as exc:
            why = f"cannot start: {exc}"
            self._learnt.append(lambda: self._fail(trainer_id, why))
            return
        self.launchers[trainer_id] = launcher
        if not (trainer_dir / channel.METRICS).exists():  # new, or its directory was deleted
            self._offsets[trainer_id] = 0
        if not restart:  # a restart reads on from where the dead supervisor's reports were
            self._offsets[trainer_id] = 0
            self._samples[trainer_id] = row.samples_done
        pid = str(launcher.pid)
        self._learnt.append(
            lambda: self.store.set_launch(trainer_id, trainer_dir=trainer_dir, supervisor=pid)
        )
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
        if self._due.get(trainer_id) not in STARTS:
            self._due[trainer_id] = "hosts"
        self._intended[trainer_id] = nodes
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

    def _read_reports(self, trainer_id: str, trainer_dir: Path) -> float:
        """New lines of the trainer's ``metrics.jsonl``: progress, batch size, curves."""
        records, self._offsets[trainer_id] = channel.read_metrics(
            trainer_dir, self._offsets.get(trainer_id, 0)
        )
        before = self._samples.get(trainer_id, 0)
        row = self.store.trainer(trainer_id)
        for rec in records:
            kind = rec.get("kind")
            if kind == "reset":
                batch = rec.get("batch_size")
                if isinstance(batch, int):
                    self.store.update_progress(trainer_id, batch_size=batch)
            elif kind == "metrics":
                self._metrics(trainer_id, row, rec)
        return float(max(0, self._samples.get(trainer_id, 0) - before))

    def _metrics(self, trainer_id: str, row: TrainerRow, rec: Mapping[str, object]) -> None:
        samples = rec.get("samples_done")
        if isinstance(samples, int):
            self._samples[trainer_id] = max(self._samples.get(trainer_id, 0), samples)
        try:
            record = MetricsRecord.from_dict(rec.get("record"), f"trainer {trainer_id}")
        except MetricsRecordError as exc:
            log.warning("trainer %s: ignoring a bad metrics record: %s", trainer_id, exc)
            return
        throughput = goodput = None
        # Throughput: the rates measured at the counts it ran, and the replay's prior.
        learned = self.curves.measured(job_of(row), record)
        if learned is not None:
            self._reports.append(CurveReport(trainer_id, "throughput", learned))
        if record.throughput is not None:  # goodput: the trainer's own Pollux model
            try:
                model = record.goodput_model()
                good, thr = model.allocator_curves(row.max_nodes)
            except (MetricsRecordError, ValueError) as exc:
                log.warning("trainer %s: no goodput curve from its record: %s", trainer_id, exc)
            else:
                self._reports.append(CurveReport(trainer_id, "goodput", good))
                n = max(1, record.nodes)
                throughput = float(_at(thr, n))
                goodput = float(_at(good, n))
        self.store.update_progress(
            trainer_id,
            samples_done=self._samples.get(trainer_id),
            throughput_sps=throughput,
            goodput_sps=goodput,
            batch_size=record.batch_size,
        )
        self.store.add_metric(trainer_id, record.to_dict(), now_s=record.time_s)

    def _finish(self, trainer_id: str, state: str, reason: str) -> None:
        self._forget(trainer_id)
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
        self._forget(trainer_id)
        row = self.store.trainer(trainer_id)
        if not row.finished:
            self.store.set_trainer_state(trainer_id, "failed", reason=reason)
        self._record(trainer_id, ())
        self._reports.append(Completion(trainer_id))
        log.warning("trainer %s failed: %s", trainer_id, reason)

    def _forget(self, trainer_id: str) -> None:
        """Drop what was read of a finished trainer (the store keeps its figures): a
        daemon's memory does not grow with every trainer it ever ran."""
        self._offsets.pop(trainer_id, None)
        self._samples.pop(trainer_id, None)
        self.curves.forget(trainer_id)


def _names(nodes: Sequence[str]) -> str:
    """``node1,node2``; with shared nodes ``node1:2`` for two slots of node1."""
    return ",".join(h if n == 1 else f"{h}:{n}" for h, n in host_counts(nodes))


def _at(curve: Sequence[tuple[float, float]], n: int) -> float:
    for x, y in curve:
        if x >= n:
            return y
    return curve[-1][1] if curve else 0.0
