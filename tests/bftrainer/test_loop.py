"""The core loop itself, driven by a scripted driver and scripted sources (no replay).

``ScriptedDriver`` is the loop's ``FixedHosts``: every running trainer processes one
sample per node-second, completes at its ``work_samples``, and sends the curve reports
it is given at their times. ``RecordingPolicy`` gives every admitted trainer an equal
share and logs what it saw.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.loop import (
    Arrival,
    Cancel,
    Completion,
    CurveReport,
    Decision,
    Inbox,
    Input,
    Loop,
    LoopError,
    LoopStalledError,
    LoopState,
    Orders,
    PolicyInputs,
    PoolChange,
    Progress,
    Step,
    TimedSource,
    TrainerState,
    VirtualClock,
    WallClock,
    run,
)
from bftrainer.loop.jobs import JobSpec
from bftrainer.milp.mapping import map_counts
from bftrainer.policies.config import Config
from bftrainer.policies.registry import Admission, equal_share_counts, make_policy
from bftrainer.replay.simulator import SimulatedDriver

REPO = Path(__file__).resolve().parents[2]


def job(jid: str, work: float = 1e9, submit_s: float = 0.0, n_max: int = 8) -> JobSpec:
    return JobSpec(
        id=jid,
        model="m",
        submit_s=submit_s,
        n_min=1,
        n_max=n_max,
        rescale_up_s=0.0,
        rescale_down_s=0.0,
        work_samples=work,
        curve=((1.0, 1.0), (float(n_max), float(n_max))),
    )


class ScriptedDriver:
    """One sample per node-second; completions at ``work_samples``; scripted curve
    reports ``(time_s, CurveReport)``; logs every call as ``(name, now_s, detail)``."""

    def __init__(self, reports: Sequence[tuple[float, CurveReport]] = ()) -> None:
        self.reports = sorted(reports, key=lambda r: r[0])
        self.now_s: float | None = None
        self.calls: list[tuple[str, float, object]] = []
        self.done: set[str] = set()
        self.cancelled: list[str] = []

    def advance(self, trainers: Sequence[TrainerState], now_s: float) -> Progress:
        dt = 0.0 if self.now_s is None else now_s - self.now_s
        self.now_s = now_s
        self.calls.append(("advance", now_s, tuple(t.id for t in trainers)))
        total = 0.0
        out: list[CurveReport | Completion] = []
        for t in trainers:
            t.processed_samples += len(t.nodes) * dt
            total += len(t.nodes) * dt
            if t.id not in self.done and t.progress_samples >= t.job.work_samples - 1e-9:
                self.done.add(t.id)
                out.append(Completion(t.id))
        while self.reports and self.reports[0][0] <= now_s:
            out.append(self.reports.pop(0)[1])
        return Progress(total, tuple(out))

    def next_wakeup_s(self, trainers: Sequence[TrainerState], now_s: float) -> float:
        best = self.reports[0][0] if self.reports else math.inf
        for t in trainers:
            best = min(best, now_s + (t.job.work_samples - t.progress_samples) / len(t.nodes))
        return best

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        self.calls.append(("preempt", self.now_s or 0.0, trainer.id))
        return 0.0

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        self.calls.append(("rescale", self.now_s or 0.0, (trainer.id, nodes)))
        return 0.0

    def cancel(self, trainer: TrainerState) -> None:
        self.cancelled.append(trainer.id)


class RecordingPolicy(Admission):
    name = "recording"

    def __init__(self, log: list[tuple[str, float, object]] | None = None) -> None:
        self.seen: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
        self.log = log

    def decide(self, inputs: PolicyInputs) -> Decision:
        pool, trainers = inputs.pool, inputs.trainers
        self.seen.append((pool, tuple(t.id for t in trainers)))
        if self.log is not None:
            self.log.append(("decide", math.nan, (pool, tuple(t.id for t in trainers))))
        counts = equal_share_counts([(t.id, t.job.n_min, t.job.n_max) for t in trainers], len(pool))
        return Decision(map_counts({t.id: t.nodes for t in trainers}, counts, pool))


class Steps:
    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.intervals: list[tuple[float, float, int, float]] = []

    def interval(self, t0_s: float, t1_s: float, pool_nodes: int, processed: float) -> None:
        self.intervals.append((t0_s, t1_s, pool_nodes, processed))

    def step(self, step: Step) -> None:
        self.steps.append(step)


def make_loop(
    script: Sequence[tuple[float, Input]],
    *,
    pool: tuple[str, ...] = ("a", "b"),
    driver: ScriptedDriver | None = None,
    config: Config | None = None,
    policy: RecordingPolicy | None = None,
    keep_finished: bool = True,
) -> tuple[Loop, ScriptedDriver, RecordingPolicy, Steps]:
    driver = driver or ScriptedDriver()
    policy = policy or RecordingPolicy()
    obs = Steps()
    loop = Loop(
        [TimedSource(script)],
        driver,
        VirtualClock(0.0),
        config or Config(),
        policy=policy,
        observer=obs,
        state=LoopState(now_s=0.0, pool=pool),
        keep_finished=keep_finished,
    )
    return loop, driver, policy, obs


# --------------------------------------------------------------------------- step order
def test_one_step_advances_then_completes_then_preempts_then_admits_then_decides() -> None:
    calls: list[tuple[str, float, object]] = []
    driver = ScriptedDriver()
    driver.calls = calls
    policy = RecordingPolicy(calls)
    script: list[tuple[float, Input]] = [
        (0.0, Arrival(job("x", work=10.0))),  # 1 node: done at t=10
        (0.0, Arrival(job("y"))),
        (10.0, PoolChange(PoolEvent(10.0, joined=frozenset({"d", "c"}), left=frozenset({"b"})))),
        (10.0, Arrival(job("z"))),
    ]
    loop, _, _, obs = make_loop(script, pool=("a", "b"), driver=driver, policy=policy)
    loop.run(until_s=10.0)
    # t=0: advance (sets the driver's clock), one decision for both arrivals, x on a,
    # y on b. t=10: advance; x's completion frees a; b leaves (y is preempted); c and
    # d join in sorted order; z arrives; one decision sees all of it.
    assert [c[0] for c in calls] == [
        "advance", "decide", "rescale", "rescale",
        "advance", "preempt", "decide", "rescale", "rescale",
    ]  # fmt: skip
    assert calls[4] == ("advance", 10.0, ("x", "y"))
    assert calls[5][2] == "y"
    assert policy.seen == [(("a", "b"), ("x", "y")), (("a", "c", "d"), ("y", "z"))]
    assert [s.time_s for s in obs.steps] == [0.0, 10.0]
    last = obs.steps[-1]
    assert (last.completions, last.joined, last.left, last.arrivals) == (1, 2, 1, 1)
    assert [t.id for t in loop.finished] == ["x"]
    assert loop.finished[0].finished_s == 10.0


def test_a_services_loop_keeps_no_finished_trainer() -> None:
    """The daemon runs for months: its loop must not grow with every trainer it ran
    (the store keeps them); the replay's keeps them for its summary."""
    script: list[tuple[float, Input]] = [
        (10.0 * i, Arrival(job(f"t{i:03d}", work=5.0))) for i in range(50)
    ]
    loop, _, _, obs = make_loop(script, pool=("a", "b"), keep_finished=False)
    loop.run(until_s=600.0)
    assert sum(s.completions for s in obs.steps) == 50 and not loop.trainers
    assert loop.finished == []


def test_the_driver_learns_the_time_of_every_step_and_a_wakeup_is_not_an_event() -> None:
    report = CurveReport("x", "throughput", ((1.0, 2.0), (8.0, 16.0)))
    driver = ScriptedDriver(reports=[(25.0, report)])
    config = Config(redecide_every_s=1e9)  # a report never re-decides here
    loop, _, _, obs = make_loop([(0.0, Arrival(job("x")))], driver=driver, config=config)
    loop.run(until_s=100.0)
    assert [c[1] for c in driver.calls if c[0] == "advance"] == [0.0, 25.0, 100.0]
    assert [s.time_s for s in obs.steps] == [0.0]  # 25 (a wake-up) and 100 record nothing
    assert loop.trainers["x"].reported_curves["throughput"] == report.curve
    assert loop.trainers["x"].processed_samples == pytest.approx(200.0)
    # the observer still integrates every interval, split at the wake-up
    assert [(t0, t1) for t0, t1, _, _ in obs.intervals] == [(0.0, 25.0), (25.0, 100.0)]


def test_nothing_is_recorded_without_an_input_or_a_decision() -> None:
    class Quiet:
        """Polled every 10 s; never has anything."""

        def poll(self, now_s: float) -> object:
            from bftrainer.loop import Polled

            return Polled((), now_s + 10.0)

    obs = Steps()
    loop = Loop(
        [Quiet()],  # type: ignore[list-item]
        ScriptedDriver(),
        VirtualClock(0.0),
        Config(),
        policy=RecordingPolicy(),
        observer=obs,
        state=LoopState(now_s=0.0, pool=("a",)),
    )
    loop.step()  # the first step decides once (an empty loop is dirty at start)
    loop.run(until_s=100.0)
    assert [s.time_s for s in obs.steps] == [0.0]
    assert loop.now_s == 100.0


def test_a_sources_exec_plan_reaches_an_executor_driver_in_its_step_before_it_acts() -> None:
    """How workers reach the held nodes flows one way, as data: source -> loop -> driver,
    in the step that polled it; the driver never asks the source."""
    from bftrainer.loop import Polled

    calls: list[tuple[str, float, object]] = []

    class Holding:
        """A source that holds nodes: each poll says how they are reached now."""

        def __init__(self) -> None:
            self.plans = ["a held", "a, b held"]

        def poll(self, now_s: float) -> Polled:
            plan = self.plans.pop(0) if self.plans else None
            calls.append(("poll", now_s, plan))
            return Polled((), now_s + 10.0 if self.plans else math.inf, exec_plan=plan)

    class Executing(ScriptedDriver):
        """Its own actuator: the exec plan comes in the step's orders."""

        def learn(self, report: Sequence[object]) -> None:
            pass

        def record(self, orders: Orders) -> None:
            if orders.exec_plan is not None:
                self.calls.append(("use", orders.time_s, orders.exec_plan))

        def act(self, orders: Orders) -> Sequence[object]:
            self.calls.append(("act", orders.time_s, None))
            return ()

    driver = Executing()
    driver.calls = calls
    loop = Loop(
        [Holding()],
        driver,
        VirtualClock(0.0),
        Config(),
        policy=RecordingPolicy(),
        state=LoopState(now_s=0.0, pool=("a", "b")),
        actuator=driver,
    )
    loop.run(until_s=20.0)
    seen = [(name, t, what) for name, t, what in calls if name in ("poll", "use", "act")]
    assert seen[:6] == [
        ("poll", 0.0, "a held"), ("use", 0.0, "a held"), ("act", 0.0, None),
        ("poll", 10.0, "a, b held"), ("use", 10.0, "a, b held"), ("act", 10.0, None),
    ]  # fmt: skip
    # a poll without a plan leaves the driver's last one as it was
    assert all(w is None for name, _, w in seen[6:] if name == "poll")
    assert [c for c in seen[6:] if c[0] == "use"] == []


# --------------------------------------------------------------------------- re-decisions
def reports_every_10s(n: int) -> list[tuple[float, CurveReport]]:
    return [
        (10.0 * (k + 1), CurveReport("x", "throughput", ((1.0, 1.0 + k), (8.0, 8.0 + k))))
        for k in range(n)
    ]


def test_a_curve_report_redecides_at_most_every_redecide_every_s() -> None:
    driver = ScriptedDriver(reports=reports_every_10s(9))  # at 10, 20, ..., 90
    loop, _, policy, obs = make_loop(
        [(0.0, Arrival(job("x")))], driver=driver, config=Config(redecide_every_s=60.0)
    )
    loop.run(until_s=200.0)
    decided = [s.time_s for s in obs.steps if s.decided]
    # 0: the arrival; the report at 10 waits until 60 (a wake-up of the loop's own);
    # those at 70..90 wait until 120.
    assert decided == [0.0, 60.0, 120.0]
    assert len(policy.seen) == 3
    assert loop.trainers["x"].reported_curves["throughput"][0] == (1.0, 9.0)


def test_with_no_rate_limit_every_report_redecides_and_an_event_resets_the_timer() -> None:
    driver = ScriptedDriver(reports=reports_every_10s(3))
    loop, _, _, obs = make_loop(
        [(0.0, Arrival(job("x")))], driver=driver, config=Config(redecide_every_s=0.0)
    )
    loop.run(until_s=100.0)
    assert [s.time_s for s in obs.steps if s.decided] == [0.0, 10.0, 20.0, 30.0]

    driver = ScriptedDriver(reports=reports_every_10s(1))  # at 10
    pool_change = PoolChange(PoolEvent(40.0, joined=frozenset({"c"})))
    loop, _, _, obs = make_loop(
        [(0.0, Arrival(job("x"))), (40.0, pool_change)],
        driver=driver,
        config=Config(redecide_every_s=60.0),
    )
    loop.run(until_s=200.0)
    # the event at 40 decides with the reported curve: nothing left to re-decide at 60
    assert [s.time_s for s in obs.steps if s.decided] == [0.0, 40.0]


def test_a_report_of_an_unknown_trainer_is_ignored() -> None:
    stray = CurveReport("nobody", "throughput", ((1.0, 1.0),))
    loop, _, _, obs = make_loop([(5.0, stray)], config=Config(redecide_every_s=0.0))
    loop.run(until_s=50.0)
    assert [s.time_s for s in obs.steps] == [0.0]


# --------------------------------------------------------------------------- cancel
def test_cancel_frees_nodes_tells_the_driver_and_the_next_trainer_gets_them() -> None:
    script: list[tuple[float, Input]] = [
        (0.0, Arrival(job("x"))),
        (0.0, Arrival(job("y"))),
        (30.0, Cancel("x")),
        (40.0, Cancel("x")),  # twice: ignored, not an event
        (50.0, Cancel("ghost")),
    ]
    loop, driver, _, obs = make_loop(script, pool=("a", "b"), config=Config(max_trainers=1))
    loop.run(until_s=100.0)
    assert driver.cancelled == ["x"]
    x = loop.finished[0]
    assert (x.id, x.cancelled_s, x.finished_s, x.nodes) == ("x", 30.0, None, ())
    assert x.processed_samples == pytest.approx(60.0)  # 2 nodes x 30 s
    assert loop.trainers["y"].nodes == ("a", "b")
    assert [(s.time_s, s.cancels) for s in obs.steps] == [(0.0, 0), (30.0, 1)]


def test_a_queued_trainer_can_be_cancelled_before_it_runs() -> None:
    script: list[tuple[float, Input]] = [
        (0.0, Arrival(job("x"))),
        (0.0, Arrival(job("y"))),
        (10.0, Cancel("y")),
    ]
    loop, _, _, _ = make_loop(script, config=Config(max_trainers=1))
    loop.run(until_s=20.0)
    assert [t.id for t in loop.finished] == ["y"]
    assert loop.finished[0].started_s is None
    assert list(loop.trainers) == ["x"]


# --------------------------------------------------------------------------- guards
class Creeping(ScriptedDriver):
    """Asks to wake a microsecond ahead, forever: at epoch milliseconds (1.6e12) the
    clock rounds that to now, as a trace in milliseconds made the old loop spin."""

    def next_wakeup_s(self, trainers: Sequence[TrainerState], now_s: float) -> float:
        return now_s + 1e-6


def test_a_clock_that_cannot_move_raises_instead_of_spinning() -> None:
    start = 1_612_915_732_000.0
    loop = Loop(
        [TimedSource([(start, Arrival(job("x", submit_s=start)))])],
        Creeping(),
        VirtualClock(start),
        Config(),
        policy=RecordingPolicy(),
        state=LoopState(now_s=start, pool=("a",)),
    )
    t0 = time.perf_counter()
    with pytest.raises(LoopStalledError, match="epoch milliseconds"):
        loop.run(until_s=start + 3600_000)
    assert time.perf_counter() - t0 < 5.0


def test_the_simulated_driver_finishes_jobs_even_at_epoch_milliseconds() -> None:
    """Issue 10's hang, with the real driver: at 1.6e12 a completion microseconds ahead
    rounds to now, and the old loop called advance a million times at one instant (then
    stopped with LoopStalledError). Issue 19: the driver wakes at the next representable
    instant instead, so every job finishes at any clock magnitude."""
    t0 = 1_612_915_732_000.0
    jobs = [
        JobSpec(f"j{i}", "m", t0, 1, 4, 18.0, 12.0, 3.3e7 + 7919 * i + 2,
                ((1.0, 333.3), (4.0, 1111.1)))
        for i in range(3)
    ]  # fmt: skip
    source = TimedSource((t0, Arrival(j)) for j in jobs)
    config = Config(policy="equal")
    loop = Loop([source], SimulatedDriver(), VirtualClock(t0), config, policy=make_policy(config),
                state=LoopState(now_s=t0, pool=("a", "b", "c", "d")))  # fmt: skip
    t_wall = time.perf_counter()
    loop.run(until_s=t0 + 3_600_000.0, stop=lambda lp: source.exhausted and not lp.trainers)
    assert not loop.trainers, "every job finished"
    assert loop.now_s < t0 + 3_600_000.0
    assert time.perf_counter() - t_wall < 30.0


def test_the_same_creeping_driver_is_fine_where_the_clock_can_move() -> None:
    loop = Loop(
        [TimedSource([(0.0, Arrival(job("x")))])],
        Creeping(),
        VirtualClock(0.0),
        Config(),
        policy=RecordingPolicy(),
        state=LoopState(now_s=0.0, pool=("a",)),
    )
    loop.run(until_s=0.01)  # 10,000 steps of a microsecond
    assert loop.now_s == 0.01


def test_inputs_out_of_time_order_are_refused() -> None:
    source = TimedSource([(5.0, Cancel("x")), (1.0, Cancel("y"))])
    with pytest.raises(LoopError, match="out of time order"):
        source.poll(10.0)


def test_a_trainer_arriving_twice_is_refused() -> None:
    loop, _, _, _ = make_loop([(0.0, Arrival(job("x"))), (5.0, Arrival(job("x")))])
    with pytest.raises(LoopError, match="'x' arrived twice"):
        loop.run(until_s=10.0)


# --------------------------------------------------------------------------- state and restore
def equal_run(stop_at: float | None) -> tuple[list[TrainerState], list[Step]]:
    """x, y, z on a changing pool; if ``stop_at``, the loop is rebuilt from its state
    there (a daemon's restart) with a fresh driver and policy."""
    script: list[tuple[float, Input]] = [
        (0.0, Arrival(job("x", work=300.0))),
        (0.0, Arrival(job("y", work=900.0))),
        (50.0, PoolChange(PoolEvent(50.0, joined=frozenset({"c", "d"})))),
        (80.0, Arrival(job("z", work=400.0))),
        (120.0, PoolChange(PoolEvent(120.0, left=frozenset({"a"})))),
    ]
    source = TimedSource(script)
    obs = Steps()
    loop = Loop([source], ScriptedDriver(), VirtualClock(0.0), Config(), policy=RecordingPolicy(),
                observer=obs, state=LoopState(now_s=0.0, pool=("a", "b")))  # fmt: skip
    if stop_at is not None:
        loop.run(until_s=stop_at)
        saved = loop.state()
        loop = Loop([source], ScriptedDriver(), VirtualClock(saved.now_s), Config(),
                    policy=RecordingPolicy(), observer=obs, state=saved)  # fmt: skip
    loop.run(until_s=1000.0, stop=lambda lp: source.exhausted and not lp.trainers)
    return loop.finished, obs.steps


def test_a_loop_rebuilt_from_its_state_goes_on_as_if_never_stopped() -> None:
    finished, steps = equal_run(None)
    again, steps2 = equal_run(100.0)
    assert [(t.id, t.finished_s) for t in again] == [(t.id, t.finished_s) for t in finished]
    assert [t.processed_samples for t in again] == pytest.approx(
        [t.processed_samples for t in finished]
    )
    # the restart adds one decision (at 100) that moves nothing; all else is the same
    extra = [s for s in steps2 if s.time_s == 100.0]
    assert len(extra) == 1 and extra[0].decided
    assert extra[0].rescale_cost_samples == 0.0 and extra[0].allocated_nodes == 4

    def shape(ss: list[Step]) -> list[tuple[float, int, int, int, int]]:
        return [(s.time_s, s.pool_nodes, s.allocated_nodes, s.running, s.completions) for s in ss]

    assert shape([s for s in steps2 if s.time_s != 100.0]) == shape(steps)


@pytest.mark.parametrize(
    ("trainers", "message"),
    [
        ([TrainerState(job("x"), nodes=("zz",))], "holds node 'zz', not in the pool"),
        (
            [TrainerState(job("x"), nodes=("a",)), TrainerState(job("y"), nodes=("a",))],
            "node 'a' is held by both 'x' and 'y'",
        ),
        ([TrainerState(job("x")), TrainerState(job("x"))], "'x' appears twice"),
    ],
)
def test_a_state_that_cannot_be_restored_names_what_is_wrong(
    trainers: list[TrainerState], message: str
) -> None:
    with pytest.raises(LoopError, match=message):
        Loop([], ScriptedDriver(), VirtualClock(0.0), Config(), policy=RecordingPolicy(),
             state=LoopState(now_s=0.0, pool=("a", "b"), trainers=trainers))  # fmt: skip


def test_decisions_report_their_latency_and_other_steps_none() -> None:
    script: list[tuple[float, Input]] = [
        (0.0, Arrival(job("x", work=10.0))),
        (0.0, Arrival(job("y"))),
    ]
    loop, _, _, obs = make_loop(script, config=Config(max_trainers=1))
    loop.run(until_s=100.0)
    assert [s.decided for s in obs.steps] == [True, True]  # arrival; x's completion
    assert all(s.latency_s > 0 for s in obs.steps)
    assert all(s.latency_s < 1.0 for s in obs.steps)


# --------------------------------------------------------------------------- live mode
def test_the_wall_clock_loop_wakes_for_pushed_inputs_and_stops_on_request() -> None:
    clock = WallClock()
    inbox = Inbox(clock)
    obs = Steps()
    loop = Loop([inbox], ScriptedDriver(), clock, Config(), policy=RecordingPolicy(),
                observer=obs, state=LoopState(now_s=clock.now_s(), pool=("a", "b")))  # fmt: skip
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    time.sleep(0.2)
    pushed = time.perf_counter()
    inbox.put(Arrival(job("x")))
    while len(obs.steps) < 2 and time.perf_counter() - pushed < 5.0:
        time.sleep(0.01)
    woke_s = time.perf_counter() - pushed
    loop.request_stop()
    thread.join(5.0)
    assert not thread.is_alive()
    assert woke_s < 2.0  # it slept "forever" (nothing was due) and the put woke it
    assert [(s.arrivals, s.decided) for s in obs.steps] == [(0, True), (1, True)]
    assert loop.trainers["x"].nodes == ("a", "b")


def test_a_signal_handler_stops_a_loop_that_sleeps_with_nothing_due() -> None:
    clock = WallClock()
    loop = Loop([Inbox()], ScriptedDriver(), clock, Config(), policy=RecordingPolicy(),
                state=LoopState(now_s=clock.now_s(), pool=("a",)))  # fmt: skip
    previous = signal.signal(signal.SIGALRM, lambda *_: loop.request_stop())
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        t0 = time.perf_counter()
        loop.run()  # nothing is ever due: it sleeps until the handler wakes it
        elapsed = time.perf_counter() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        clock.close()
    assert 0.2 < elapsed < 3.0


def test_the_wall_clock_waits_longer_than_select_can_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll interval of 1e12 s (a config allows it) put the daemon's next step 1e12 s
    ahead, and select() raised OverflowError: a traceback. Now such a wait is slept a
    chunk at a time, and a wake still ends it."""
    clock = WallClock()
    try:
        clock.wake()  # so that the wait below ends at once, woken
        assert clock.wait_until(time.time() + 1e12) < time.time() + 60
        monkeypatch.setattr("bftrainer.loop.clocks.MAX_SLEEP_S", 0.01)
        target = time.time() + 0.05
        assert clock.wait_until(target) >= target  # chunks of 0.01 s, to the end
    finally:
        clock.close()


def test_run_is_the_loop_in_one_call() -> None:
    source = TimedSource([(0.0, Arrival(job("x", work=20.0)))])
    config = Config(policy="equal")
    loop = run(
        [source],
        ScriptedDriver(),
        VirtualClock(0.0),
        config,
        policy=make_policy(config),
        state=LoopState(now_s=0.0, pool=("a", "b")),
        until_s=1000.0,
        stop=lambda lp: source.exhausted and not lp.trainers,
    )
    assert loop.now_s == 10.0
    assert loop.finished[0].finished_s == 10.0


# --------------------------------------------------------------------------- determinism
REPLAY = """
import json
from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
from bftrainer.replay.run import ReplayConfig, replay
from bftrainer.replay.workload import hpo_workload
trace = synthetic_trace(SyntheticConfig(nodes=96, duration_s=4 * 3600, seed=5))
jobs = hpo_workload(40, trace.start_s, interval_s=120.0, work_samples=3e8)
s = replay(trace, jobs, ReplayConfig(policy="equal")).summary
print(json.dumps({k: s[k] for k in ("utilization_efficiency", "rescale_cost_samples",
    "preemption_cost_samples", "events", "trainers_completed")}))
"""


def test_a_replay_gives_the_same_figures_at_any_hash_seed() -> None:
    out = []
    for seed in ("0", "1"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-c", REPLAY], env=env, cwd=REPO, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        out.append(json.loads(proc.stdout))
    assert out[0] == out[1]
    assert out[0]["preemption_cost_samples"] > 0  # nodes left and joined: order mattered


def test_the_held_count_is_the_nodes_the_trainers_hold_at_every_step() -> None:
    """A step's ``allocated_nodes`` is kept as a count (no set of the held nodes is built
    each step): it equals the nodes the trainers hold, through arrivals (with every slot
    taken too), completions, cancels, joins and preemptions."""
    import random

    rng = random.Random(3)
    names = [f"n{i}" for i in range(12)]
    script: list[tuple[float, Input]] = []
    idle = set(names[:6])
    for k in range(60):
        t = float(k)
        script.append((t, Arrival(job(f"j{k}", work=rng.choice([5.0, 40.0, 1e9]), submit_s=t))))
        if k % 3 == 0:
            left = frozenset(rng.sample(sorted(idle), min(len(idle), rng.randint(0, 3))))
            joined = frozenset(rng.sample(sorted(set(names) - idle), rng.randint(0, 3)))
            idle = (idle - left) | joined
            script.append((t + 0.5, PoolChange(PoolEvent(t + 0.5, joined, left))))
        if k % 7 == 6:
            script.append((t + 0.25, Cancel(f"j{k - 3}")))
    script.sort(key=lambda s: s[0])
    loop, _, _, _ = make_loop(script, pool=tuple(names[:6]), config=Config(max_trainers=3))
    seen: list[tuple[int, int]] = []

    class Check(Steps):
        def step(self, step: Step) -> None:
            held = {n for t in loop.trainers.values() for n in t.nodes}
            seen.append((step.allocated_nodes, len(held)))

    loop.observer = Check()
    loop.run(until_s=70.0)
    assert len(seen) > 60 and any(a for a, _ in seen)
    assert all(a == b for a, b in seen)
