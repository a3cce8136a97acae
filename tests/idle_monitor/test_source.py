"""The pool-tracking logic shared by schedulers: horizon, windows, blip filtering,
staleness. Driven through the Slurm adapter with Slurm-format outputs in sequence."""

from __future__ import annotations

import pytest

from bftrainer.idle_monitor.runner import ReplayRunner, recorded
from bftrainer.idle_monitor.slurm import SlurmScheduler
from bftrainer.idle_monitor.source import (
    Claims,
    LivePoolSource,
    NodeStates,
    PoolConfig,
    cut_pool,
)

DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"


def sinfo(**states: str) -> str:
    return "".join(f"{n}|{s}\n" for n, s in states.items())


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(config: PoolConfig | None = None) -> tuple[LivePoolSource, ReplayRunner, Clock]:
    runner = ReplayRunner(
        {"sinfo": [recorded("n1|idle\n")], "squeue": [recorded("")], "scontrol": [recorded("")]}
    )
    clock = Clock()
    return LivePoolSource(SlurmScheduler(), runner, config, clock=clock), runner, clock


def step(source: LivePoolSource, runner: ReplayRunner, clock: Clock, text: str, dt: float = 10):
    clock.t += dt
    runner.set_replies("sinfo", [recorded(text)])
    return source.poll()


def test_cut_pool_horizon_and_set_aside() -> None:
    states = NodeStates(0.0, frozenset("abcde"), frozenset("abc"), frozenset("de"))
    claims = {"a": 100.0, "b": 1000.0, "d": 1000.0}  # e: set aside, time unknown
    pool, windows = cut_pool(states, claims, now_s=0.0, horizon_s=300.0)
    assert pool == {"b", "c", "d"}
    assert windows == {"b": 1000.0, "c": None, "d": 1000.0}
    pool0, _ = cut_pool(states, {"a": -5.0}, now_s=0.0, horizon_s=0.0)
    assert "a" not in pool0  # a claim already due keeps the node out even at horizon 0


def test_blip_is_not_a_join_and_events_only_on_change() -> None:
    source, runner, clock = make()
    first = step(source, runner, clock, sinfo(n1="idle", n2="allocated"))
    assert first is not None and first.joined == {"n1"} and first.windows_s == {"n1": None}
    # n2 idle in one record only, between two jobs: no join
    assert step(source, runner, clock, sinfo(n1="idle", n2="idle")) is None
    assert step(source, runner, clock, sinfo(n1="idle", n2="allocated")) is None
    # idle in two records: joins at the second
    assert step(source, runner, clock, sinfo(n1="idle", n2="idle")) is None
    joined = step(source, runner, clock, sinfo(n1="idle", n2="idle"))
    assert joined is not None and joined.joined == {"n2"} and joined.time_s == clock.t
    assert step(source, runner, clock, sinfo(n1="idle", n2="idle")) is None
    # leaves are immediate
    left = step(source, runner, clock, sinfo(n1="allocated", n2="idle"))
    assert left is not None and left.left == {"n1"} and left.windows_s == {"n2": None}


def test_unfiltered_joins_at_once() -> None:
    source, runner, clock = make(PoolConfig(filter_blips=False))
    step(source, runner, clock, sinfo(n1="idle", n2="allocated"))
    event = step(source, runner, clock, sinfo(n1="idle", n2="idle"))
    assert event is not None and event.joined == {"n2"}


def test_event_carries_windows_of_the_pool() -> None:
    source, runner, clock = make(PoolConfig(horizon_s=60))
    start = clock.t + 10 + 500
    runner.set_replies("squeue", [recorded(f"9|main|2|{int(start)}|n2|Resources\n")])
    event = step(source, runner, clock, sinfo(n1="idle", n2="planned"))
    assert event is not None and event.joined == {"n1", "n2"}
    assert event.windows_s == {"n1": None, "n2": pytest.approx(500)}
    clock.t += 100
    assert source.view().windows_s["n2"] == pytest.approx(400)


def test_stale_claims_stop_growth_but_not_leaves() -> None:
    source, runner, clock = make(PoolConfig(max_stale_s=60))
    step(source, runner, clock, sinfo(n1="idle", n2="idle", n3="allocated"))
    runner.set_replies("squeue", [recorded(stderr=DOWN, returncode=1)])
    # within max_stale_s the last claims are still trusted: n3 may join
    step(source, runner, clock, sinfo(n1="idle", n2="idle", n3="idle"), dt=20)
    event = step(source, runner, clock, sinfo(n1="idle", n2="idle", n3="idle"), dt=20)
    assert event is not None and event.joined == {"n3"}
    step(source, runner, clock, sinfo(n1="idle", n2="idle", n3="allocated"), dt=20)
    # claims now 70 s old > 60 s: no growth, a leave still goes through
    assert step(source, runner, clock, sinfo(n1="idle", n2="idle", n3="idle"), dt=10) is None
    assert step(source, runner, clock, sinfo(n1="idle", n2="idle", n3="idle"), dt=10) is None
    assert source.last_reading is not None and source.last_reading.growth_held
    left = step(source, runner, clock, sinfo(n1="allocated", n2="idle", n3="idle"))
    assert left is not None and left.left == {"n1"} and not left.joined
    # claims readable again: growth resumes (after the blip filter's one record)
    runner.set_replies("squeue", [recorded("")])
    step(source, runner, clock, sinfo(n1="idle", n2="idle", n3="idle"))
    event = step(source, runner, clock, sinfo(n1="idle", n2="idle", n3="idle"))
    assert event is not None and event.joined == {"n1", "n3"}


def test_no_growth_before_claims_were_ever_read() -> None:
    source, runner, clock = make()
    runner.set_replies("scontrol", [recorded(stderr="slurm_load_reservations error", returncode=1)])
    assert step(source, runner, clock, sinfo(n1="idle")) is None
    assert source.view().pool == frozenset() and source.view().growth_held


def test_node_failure_keeps_pool_then_recovers() -> None:
    source, runner, clock = make(PoolConfig(max_stale_s=30))
    step(source, runner, clock, sinfo(n1="idle", n2="allocated"))
    runner.set_replies(
        "sinfo", [recorded(stderr="slurm_load_partitions: Socket timed out", returncode=1)]
    )
    for _ in range(5):
        clock.t += 10
        assert source.poll() is None
    view = source.view()
    assert view.pool == {"n1"} and view.stale and view.stale_s == 40 and view.growth_held
    event = step(source, runner, clock, sinfo(n1="allocated", n2="allocated"))
    assert event is not None and event.left == {"n1"}
    assert not source.view().stale


def test_claims_record_shape() -> None:
    claims = Claims(5.0, {"a": 10.0})
    assert claims.take_back_s["a"] == 10.0
    with pytest.raises(ValueError, match="missing from the node list"):
        NodeStates(0.0, frozenset({"a"}), frozenset({"b"}))
