"""A supervisor's death is counted once, however often the daemon stops meanwhile.

The live driver decides a restart (counted in the store) and starts the new supervisor
after a backoff. A daemon killed or stopped within that backoff used to find the same
dead supervisor again on re-attach and count its death a second time: three daemon
restarts in a row failed a trainer that had lost its supervisor once (the soak's
seed 3). Real torchrun
trainers of the example, run here ("local" exec).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from bftrainer.daemon.live_driver import LiveDriver
from bftrainer.loop import NodeChange, Orders, TrainerState
from bftrainer.loop.jobs import job_of
from bftrainer.state import Store, ensure_state_dir
from bftrainer.trainers.launch.base import Launcher, LaunchError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"

pytestmark = pytest.mark.slow


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    yield ensure_state_dir(tmp_path / "state")
    # Stop what the test started, by the pids in its trainers' directories.
    for pid_file in tmp_path.glob("state/trainers/*/supervisor.pid"):
        with contextlib.suppress(LaunchError):
            Launcher.attach(pid_file.parent).kill()


def driver(store: Store, state_dir: Path, restart_backoff_s: float = 10.0) -> LiveDriver:
    return LiveDriver(
        store,
        state_dir,
        report_every_s=0.5,
        restart_backoff_s=restart_backoff_s,
    )


LEARNT: dict[int, Sequence[object]] = {}  # per driver: what its last act learnt


def start_on(live: LiveDriver, trainer: TrainerState) -> None:
    """The step that decides the trainer's nodes, as the loop orders it: recorded, then
    carried out (what that learnt is recorded at the next step)."""
    change = NodeChange(trainer.id, trainer.nodes, "decide", 0)
    orders = Orders(time.time(), (change,), {trainer.id: trainer.nodes})
    live.record(orders)
    LEARNT[id(live)] = live.act(orders)


def flush(live: LiveDriver) -> None:
    """Record what the last actions learnt (the next step's start, or the exit)."""
    live.learn(LEARNT.pop(id(live), ()))


def step(live: LiveDriver, trainers: list[TrainerState]) -> None:
    """One step of the daemon's loop as its driver sees it: record what the last step's
    actions learnt, advance, record the step's orders, then act (after the commit)."""
    now_s = time.time()
    flush(live)
    progress = live.advance(trainers, now_s)
    orders = Orders(now_s, driver=progress.orders)
    live.record(orders)
    LEARNT[id(live)] = live.act(orders)


def wait_for(cond, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_restart_pending_when_the_daemon_stops_is_done_not_counted_again(
    state_dir: Path,
) -> None:
    store = Store.open(state_dir)
    tid = store.submit(str(EXAMPLE), (), backend="torchrun", n_max=1, work_samples=10**7)
    trainer = TrainerState(job_of(store.trainer(tid)), nodes=("n0",))
    first = driver(store, state_dir)
    start_on(first, trainer)
    pid = first.launchers[tid].pid
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not first.launchers[tid].alive(), 10, "the supervisor gone")
    step(first, [trainer])
    assert store.trainer(tid).restarts == 1, "its death is counted once, when decided"
    assert tid not in first.launchers, "restarted only after the backoff"

    # The daemon stops before the backoff ends; the next one starts it at once.
    again = driver(store, state_dir)
    again.attach(store.trainer(tid), trainer.nodes)
    step(again, [trainer])
    flush(again)  # the new supervisor's pid, recorded at the next step
    row = store.trainer(tid)
    assert (row.restarts, row.state) == (1, "running"), row.reason
    launcher = again.launchers[tid]
    assert launcher.alive() and launcher.pid != pid, "started again"
    assert row.supervisor == str(launcher.pid)


def test_a_live_supervisor_is_re_attached_not_restarted(state_dir: Path) -> None:
    store = Store.open(state_dir)
    tid = store.submit(str(EXAMPLE), (), backend="torchrun", n_max=1, work_samples=10**7)
    trainer = TrainerState(job_of(store.trainer(tid)), nodes=("n0",))
    first = driver(store, state_dir)
    start_on(first, trainer)
    pid = first.launchers[tid].pid
    again = driver(store, state_dir)
    again.attach(store.trainer(tid), trainer.nodes)
    again.advance([trainer], time.time())
    assert again.launchers[tid].pid == pid and store.trainer(tid).restarts == 0


def test_a_supervisor_killed_more_often_than_the_budget_between_commits_fails_the_trainer(
    state_dir: Path,
) -> None:
    """The daemon takes from the trainer's one budget (trainers/launch/restarts.py): three
    restarts without a new commit, the fourth death fails it, saying why."""
    store = Store.open(state_dir)
    never_commits = ("--commit-every-s", "3600", "--commit-every-steps", "1000000000")
    tid = store.submit(str(EXAMPLE), never_commits, backend="torchrun", n_max=1, work_samples=10**7)
    trainer = TrainerState(job_of(store.trainer(tid)), nodes=("n0",))
    live = driver(store, state_dir, restart_backoff_s=0.0)
    start_on(live, trainer)
    for death in range(1, 5):
        launcher = live.launchers[tid]
        os.kill(launcher.pid, signal.SIGKILL)
        wait_for(lambda launcher=launcher: not launcher.alive(), 10, "the supervisor gone")
        step(live, [trainer])  # its death seen: a restart decided, or not
        step(live, [trainer])  # no backoff: started again at once
        row = store.trainer(tid)
        if death <= 3:
            assert row.state == "running" and tid in live.launchers, (death, row.reason)
    assert not (state_dir / "trainers" / tid / "checkpoint.pt").exists(), "it committed"
    assert (row.state, row.restarts) == ("failed", 3), row
    assert row.reason.startswith("gave up after 3 restarts without a new commit; the last: ")
