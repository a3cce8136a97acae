"""A daemon step is one transaction, committed before anything acts on it; a daemon killed
between that commit and the actions loses nothing: its restart does them.

The daemon's own parts on a fixed pool: the store, the submission queue, the live driver
(real torchrun trainers of the example, run here: "local" exec) and the loop with the
store's transaction. Holders are the one part left out (their commands are planned in
the step and run after it the same way: tests/bftrainer/test_daemon_cancel.py). A kill
is an exception raised at the chosen point: like SIGKILL, it ends that daemon's code
there, and what was inside the open transaction is rolled back.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from bftrainer.daemon import UNFINISHED, SubmissionQueue
from bftrainer.daemon.live_driver import LiveDriver
from bftrainer.daemon.live_orders import Launched, StartFailed
from bftrainer.loop import Loop, LoopState, Orders, WallClock
from bftrainer.policies.config import Config
from bftrainer.policies.registry import make_policy
from bftrainer.state import Store, ensure_state_dir
from bftrainer.trainers.launch import remote
from bftrainer.trainers.launch.base import SUPERVISOR_MODULE, Launcher, LaunchError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"
POOL = ("n0", "n1")
WORK = 3000
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")

pytestmark = pytest.mark.slow


class Killed(Exception):
    """The daemon dies here (nothing of its code runs after)."""


class Driver(LiveDriver):
    """The live driver, noting where its actions fall among the store's statements, and
    dying at ``die_at``: "act" (the first action, after the commit of the step that
    decided the start) or "record" (the next step, before it records what the start
    learnt: the supervisor runs, its pid is not in the store)."""

    def __init__(self, store: Store, state_dir: Path, log: list[str], die_at: str = "") -> None:
        super().__init__(store, state_dir, report_every_s=0.5)
        self.log = log
        self.die_at = die_at
        self.started: list[int] = []

    def act(self, orders: Orders) -> list[Launched | StartFailed]:
        if self.die_at == "act" and (orders.changes or orders.driver):
            raise Killed
        self.log.append("ACT")
        before = dict(self.launchers)
        learnt = super().act(orders)
        self.started += [la.pid for t, la in self.launchers.items() if before.get(t) is not la]
        return learnt

    def learn(self, learnt: Sequence[object]) -> None:
        if self.die_at == "record" and self.started:
            raise Killed
        super().learn(learnt)


@contextlib.contextmanager
def daemon(
    state_dir: Path, log: list[str], die_at: str = ""
) -> Iterator[tuple[Loop, Driver, Store]]:
    """A daemon's loop on ``state_dir`` (restored from it, as Daemon.restore does)."""
    with Store.open(state_dir) as store:
        store._conn.set_trace_callback(log.append)
        driver = Driver(store, state_dir, log, die_at)
        with store.transaction():
            trainers, _, orders = driver.restore(store.trainers(UNFINISHED), set(POOL))
        learnt = driver.act(orders)
        with store.transaction():
            driver.learn(learnt)
        queue = SubmissionQueue(store, [t.id for t in trainers], curves=driver.curves)
        config = Config(policy="equal")
        loop = Loop(
            [queue],
            driver,
            WallClock(),
            config,
            policy=make_policy(config),
            state=LoopState(now_s=time.time(), pool=POOL, trainers=trainers),
            keep_finished=False,
            transaction=store.transaction,
            actuator=driver,
        )
        yield loop, driver, store


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    yield ensure_state_dir(tmp_path / "state")
    for pid_file in tmp_path.glob("state/trainers/*/supervisor.pid"):  # what we started
        with contextlib.suppress(LaunchError):
            Launcher.attach(pid_file.parent).kill()


def supervisors(trainer_dir: Path) -> list[int]:
    """The supervisor processes running for ``trainer_dir`` now, whoever started them."""
    mine = str(trainer_dir.resolve()).encode()
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            running = SUPERVISOR_MODULE.encode() in argv and mine in argv
            if running and remote.alive(int(entry.name)):
                found.append(int(entry.name))
    return sorted(found)


def run_to_the_end(loop: Loop, store: Store, trainer_id: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while store.trainer(trainer_id).state not in ("done", "failed", "cancelled"):
        assert time.monotonic() < deadline, f"{trainer_id}: {store.trainer(trainer_id)}"
        loop.step(until_s=time.time() + 0.5)


def submit(state_dir: Path) -> str:
    with Store.open(state_dir) as store:
        return store.submit(str(EXAMPLE), (), backend="torchrun", n_max=2, work_samples=WORK)


def test_a_step_commits_once_and_acts_after_its_commit(state_dir: Path) -> None:
    tid = submit(state_dir)
    log: list[str] = []
    with daemon(state_dir, log) as (loop, driver, store):
        steps = 0
        deadline = time.monotonic() + 240
        while store.trainer(tid).state != "done":
            assert time.monotonic() < deadline, store.trainer(tid)
            del log[:]
            loop.step(until_s=time.time() + 0.5)
            steps += 1
            begins = [i for i, s in enumerate(log) if s.startswith("BEGIN")]
            commits = [i for i, s in enumerate(log) if s == "COMMIT"]
            assert len(begins) == len(commits) == 1, log  # one transaction a step
            writes = [i for i, s in enumerate(log) if s.lstrip().upper().startswith(WRITES)]
            assert all(begins[0] < i < commits[0] for i in writes), log  # all of it inside
            assert log.index("ACT") > commits[0], log  # acted on once committed
        assert steps > 2 and driver.started
        row = store.trainer(tid)
        assert (row.state, row.samples_done) == ("done", WORK)


@pytest.mark.parametrize("die_at", ["act", "record"])
def test_a_kill_between_the_commit_and_the_action_loses_nothing(
    state_dir: Path, die_at: str
) -> None:
    tid = submit(state_dir)
    trainer_dir = state_dir / "trainers" / tid
    log: list[str] = []
    with daemon(state_dir, log, die_at) as (loop, first, store), pytest.raises(Killed):
        run_to_the_end(loop, store, tid)
    # What the dead daemon left: the start decided and committed; done or not.
    with Store.open(state_dir) as store:
        row = store.trainer(tid)
        assert row.state == "running" and store.current_allocation(tid)
        assert row.supervisor is None  # never recorded: the step that would was killed
    assert supervisors(trainer_dir) == first.started  # [] when it died before acting

    with daemon(state_dir, []) as (loop, again, store):
        # The restart did what was decided, once: a supervisor left running is adopted.
        running = supervisors(trainer_dir)
        assert len(running) == 1, running
        if first.started:
            assert running == first.started and again.started == []
        run_to_the_end(loop, store, tid)
        row = store.trainer(tid)
        assert (row.state, row.samples_done, row.restarts) == ("done", WORK, 0), row.reason
