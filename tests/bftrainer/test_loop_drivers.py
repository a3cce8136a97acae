"""The contract every trainer driver passes, under the real loop.

``DRIVERS`` lists driver factories; a new driver (the daemon's live one) adds a line.
A factory gets a temporary folder and returns a :class:`DriverCase`: the driver, jobs
it can run to completion within ``horizon_s`` on ``nodes`` nodes, and the pool.
The driver is wrapped in :class:`Checked`, which asserts the protocol at every call.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.loop import (
    Actuator,
    Arrival,
    Cancel,
    Completion,
    CurveReport,
    Inbox,
    Input,
    Loop,
    LoopState,
    Orders,
    PoolChange,
    Progress,
    TimedSource,
    TrainerDriver,
    TrainerState,
    VirtualClock,
    WallClock,
)
from bftrainer.loop.jobs import JobSpec
from bftrainer.policies.config import Config
from bftrainer.policies.registry import make_policy
from bftrainer.replay.pollux.sim import PolluxSimDriver, PolluxSimOptions
from bftrainer.replay.rigid import CheckpointRestartDriver
from bftrainer.replay.simulator import SimulatedDriver
from tests.bftrainer.test_loop import ScriptedDriver, job
from tests.bftrainer.test_pollux_replay import toy_job, write_toy


@dataclass
class DriverCase:
    driver: TrainerDriver
    jobs: list[JobSpec]
    horizon_s: float
    pool: tuple[str, ...] = ("n0", "n1", "n2", "n3")
    # A live driver runs real trainers: the wall clock, script times from its start.
    wall_clock: bool = False
    # The policy it runs under: rigid jobs need the scavenger policy.
    config: Config = field(default_factory=lambda: Config(policy="equal", redecide_every_s=30.0))
    # What records and carries out the step's orders (the live driver's own).
    actuator: Actuator | None = None


def simulated(tmp: Path) -> DriverCase:
    jobs = [
        JobSpec("a", "m", 0.0, 1, 4, 5.0, 2.0, 4000.0, ((1.0, 10.0), (4.0, 40.0))),
        JobSpec("b", "m", 30.0, 1, 4, 5.0, 2.0, 6000.0, ((1.0, 10.0), (4.0, 30.0))),
        JobSpec("c", "m", 60.0, 1, 2, 5.0, 2.0, 1000.0, ((1.0, 5.0), (2.0, 10.0))),
    ]
    return DriverCase(SimulatedDriver(), jobs, 5000.0)


def rigid(tmp: Path) -> DriverCase:
    """Rigid jobs that checkpoint and restart (the scavenger baseline), under its policy."""
    driver = CheckpointRestartDriver(checkpoint_every_s=20.0, restart_s=3.0)
    return DriverCase(driver, simulated(tmp).jobs, 5000.0, config=Config(policy="scavenger"))


def pollux(tmp: Path, batch_adapt: bool = True) -> DriverCase:
    data = write_toy(tmp, epoch=20)
    specs = [
        toy_job(data, 10, jid="a"),
        toy_job(data, 10, jid="b", submit_s=30.0, up_s=5.0),
        toy_job(data, 20, jid="c", submit_s=60.0),
    ]
    options = PolluxSimOptions(batch_adapt=batch_adapt, noise=0.05, report_interval_s=20.0)
    driver = PolluxSimDriver({s.id: j for s, j in specs}, data, options)
    return DriverCase(driver, [s for s, _ in specs], 5000.0)


def scripted(tmp: Path) -> DriverCase:
    return DriverCase(ScriptedDriver(), [job("a", 300.0), job("b", 500.0, 30.0)], 5000.0)


def live(tmp: Path) -> DriverCase:
    """The daemon's driver on real torchrun trainers of the example, run here ("local"
    exec: the pool's node names are this machine)."""
    from bftrainer.daemon.live_driver import LiveDriver
    from bftrainer.loop.jobs import job_of
    from bftrainer.state import Store, ensure_state_dir

    state_dir = ensure_state_dir(tmp / "state")
    store = Store.open(state_dir)
    example = str(Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py")
    jobs = []
    # The first runs long enough, reporting often, to be seen running before it ends.
    for work, n_max, submit_s in ((100_000, 2, 0.0), (2000, 2, 5.0), (1000, 1, 10.0)):
        tid = store.submit(
            example,
            ("--report-every-s", "0.5"),
            backend="torchrun",
            n_max=n_max,
            work_samples=work,
        )
        jobs.append(replace(job_of(store.trainer(tid)), submit_s=submit_s))
    driver = LiveDriver(store, state_dir, report_every_s=1.0)
    return DriverCase(driver, jobs, 900.0, wall_clock=True, actuator=driver)


DRIVERS: dict[str, Callable[[Path], DriverCase]] = {
    "simulated": simulated,
    "rigid": rigid,
    "pollux-adaptive": pollux,
    "pollux-fixed-batch": lambda tmp: pollux(tmp, batch_adapt=False),
    "scripted": scripted,
    "live": live,
}


@dataclass
class Checked:
    """Wraps a driver and asserts the protocol on every call."""

    inner: TrainerDriver
    actuator: Actuator | None = None
    known: dict[str, TrainerState] = field(default_factory=dict)
    now_s: float | None = None
    completed: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)
    reports: list[CurveReport] = field(default_factory=list)
    processed: float = 0.0
    # (trainer id, inbox): put Cancel(id) there once the driver reports the trainer's
    # first progress, so a cancel lands on a running trainer whatever the clock's pace.
    cancel_when_running: tuple[str, Inbox] | None = None

    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        assert self.now_s is None or now_s >= self.now_s, "the clock went back"
        first = self.now_s is None
        for t in trainers:
            assert t.nodes, f"{t.id} was advanced without nodes"
            assert t.id not in self.completed | self.cancelled
            self.known[t.id] = t
        before = {t.id: (t.nodes, dict(t.reported_curves), t.processed_samples) for t in trainers}
        progress = self.inner.advance(trainers, now_s)
        self.now_s = now_s
        assert isinstance(progress, Progress)
        assert math.isfinite(progress.processed_samples) and progress.processed_samples >= 0
        if first:
            assert progress.processed_samples == 0, "the first call only sets the clock"
        gained = sum(t.processed_samples - before[t.id][2] for t in trainers)
        assert progress.processed_samples == pytest.approx(gained, rel=1e-9, abs=1e-6)
        self.processed += progress.processed_samples
        for t in trainers:
            nodes, curves, _ = before[t.id]
            assert t.nodes == nodes, "a driver never moves nodes"
            assert t.reported_curves == curves, "curves are reported as inputs, not written"
        for r in progress.reports:
            assert isinstance(r, CurveReport | Completion)
            # A trainer at zero nodes now may still report what it wrote while it ran
            # (the live driver reads every launched trainer), never one finished.
            assert r.trainer_id in self.known, "a report of a trainer never run"
            assert r.trainer_id not in self.cancelled, "a report of a cancelled trainer"
            if isinstance(r, Completion):
                assert r.trainer_id not in self.completed, "completion reported twice"
                self.completed.add(r.trainer_id)
            else:
                assert r.metric in ("throughput", "goodput")
                assert all(math.isfinite(n) and math.isfinite(v) for n, v in r.curve)
                self.reports.append(r)
        self._cancel_if_running(trainers)
        return progress

    def _cancel_if_running(self, trainers: Sequence[TrainerState]) -> None:
        if self.cancel_when_running is None:
            return
        tid, inbox = self.cancel_when_running
        running = [t for t in trainers if t.id == tid and t.processed_samples > 0]
        if running and tid not in self.completed:
            inbox.put(Cancel(tid))
            self.cancel_when_running = None

    def next_wakeup_s(self, trainers: Sequence[TrainerState], now_s: float) -> float:
        t = self.inner.next_wakeup_s(trainers, now_s)
        assert t >= now_s, f"a wake-up in the past: {t} < {now_s}"
        return t

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        assert old_count > len(trainer.nodes)
        cost = self.inner.preempt(trainer, old_count)
        assert math.isfinite(cost) and cost >= 0
        return cost

    # The loop's actuator: the step's orders, checked, passed on to the case's.
    def learn(self, report: Sequence[object]) -> None:
        if self.actuator is not None:
            self.actuator.learn(report)

    def record(self, orders: Orders) -> None:
        """Passed on whole (the live driver places a decision's slots at once: without
        it, a trainer handed a node before the one leaving it is moved finds it taken)."""
        assert not set(orders.decided) & (self.completed | self.cancelled)
        if self.actuator is not None:
            self.actuator.record(orders)

    def act(self, orders: Orders) -> Sequence[object]:
        """Passed on after the step's commit (the live driver acts then)."""
        return self.actuator.act(orders) if self.actuator is not None else ()

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        assert trainer.id not in self.completed | self.cancelled
        cost = self.inner.rescale(trainer, nodes)
        assert math.isfinite(cost) and cost >= 0
        return cost

    def cancel(self, trainer: TrainerState) -> None:
        self.cancelled.add(trainer.id)
        self.inner.cancel(trainer)


def drive(
    case: DriverCase, extra: Sequence[tuple[float, Input]] = (), cancel_when_running: str = ""
) -> tuple[Loop, Checked]:
    checked = Checked(case.driver, case.actuator)
    inbox = Inbox()
    if cancel_when_running:
        checked.cancel_when_running = (cancel_when_running, inbox)
    clock: VirtualClock | WallClock = WallClock() if case.wall_clock else VirtualClock(0.0)
    t0 = clock.now_s()
    script = sorted([(j.submit_s, Arrival(j)) for j in case.jobs] + list(extra), key=lambda x: x[0])
    source = TimedSource((t0 + t, _shifted(item, t0)) for t, item in script)
    loop = Loop(
        [source, inbox],
        checked,
        clock,
        case.config,
        policy=make_policy(case.config),
        state=LoopState(now_s=t0, pool=case.pool),
        actuator=checked,
    )
    loop.run(until_s=t0 + case.horizon_s, stop=lambda lp: source.exhausted and not lp.trainers)
    return loop, checked


def _shifted(item: Input, t0: float) -> Input:
    """A scripted input at ``t0`` + its time (the wall clock's start, 0 when virtual)."""
    if isinstance(item, PoolChange) and t0:
        return PoolChange(replace(item.event, time_s=item.event.time_s + t0))
    if isinstance(item, Arrival) and t0:
        return Arrival(replace(item.job, submit_s=item.job.submit_s + t0))
    return item


@pytest.fixture(
    params=[pytest.param(n, marks=pytest.mark.slow) if n == "live" else n for n in DRIVERS]
)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DriverCase]:
    yield DRIVERS[request.param](tmp_path)
    # A live case started real supervisors: stop what is left of them, by pid.
    from bftrainer.trainers.launch.base import Launcher, LaunchError

    for pid_file in tmp_path.glob("state/trainers/*/supervisor.pid"):
        with contextlib.suppress(LaunchError):
            Launcher.attach(pid_file.parent).kill()


def test_every_job_completes_once_and_the_protocol_holds(case: DriverCase) -> None:
    loop, checked = drive(case)
    assert not loop.trainers, "every job completed within the horizon"
    assert checked.completed == {j.id for j in case.jobs}
    assert all(t.finished_s is not None for t in loop.finished)
    assert checked.processed > 0


def test_nodes_that_leave_and_come_back_are_survived(case: DriverCase) -> None:
    churn: list[tuple[float, Input]] = [
        (20.0, PoolChange(PoolEvent(20.0, left=frozenset({"n0", "n1"})))),
        (45.0, PoolChange(PoolEvent(45.0, joined=frozenset({"n0"})))),
        (70.0, PoolChange(PoolEvent(70.0, left=frozenset(case.pool) - {"n0", "n1"}))),
        (90.0, PoolChange(PoolEvent(90.0, joined=frozenset(case.pool) - {"n0"}))),
    ]
    loop, checked = drive(case, churn)
    assert not loop.trainers
    assert checked.completed == {j.id for j in case.jobs}


def test_a_cancelled_trainer_is_never_run_or_reported_again(case: DriverCase) -> None:
    first = case.jobs[0].id
    loop, checked = drive(case, cancel_when_running=first)
    assert checked.cancelled == {first}, "the cancel reached the trainer while it ran"
    assert first not in checked.completed
    assert checked.completed == {j.id for j in case.jobs} - {first}
    assert [t.id for t in loop.finished if t.cancelled_s is not None] == [first]
