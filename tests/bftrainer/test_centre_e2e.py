"""Centre mode end to end on the real 8-node Slurm, with two real Unix accounts.

The test creates two accounts (CI runs as root), starts the allocator as root (the
centre's account), and has both users submit trainers at once through the socket, as
themselves. What a centre relies on, asserted here: every process of a user's trainers
and agent runs under that user's uid (``/proc/PID/status``); each node's holder job
belongs to the user whose trainer runs there (``squeue``'s user column); a user with two
trainers does not crowd out a user with one (fair by user); another user's trainer is
refused to ``cancel``, ``logs`` and ``status``; a kill -9 of the allocator and of an agent
stops no trainer, and both re-attach; every trainer finishes with exactly its work.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from bftrainer.state import daemon_running
from tests.bftrainer.centre_service import (
    WORK,
    Centre,
    NoAccounts,
    User,
    accounts,
    centre_on,
    processes_of,
    python_for_all,
    reported_samples,
    uid_of,
)
from tests.conftest import SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def python() -> Iterator[str]:
    try:
        with python_for_all() as interpreter:
            yield interpreter
    except NoAccounts as exc:
        pytest.skip(str(exc))


@pytest.fixture
def users(slurm: SlurmCluster) -> Iterator[tuple[User, User]]:
    try:
        with accounts(slurm, 2) as made:
            yield made[0], made[1]
    except NoAccounts as exc:
        pytest.skip(str(exc))


@pytest.fixture
def centre(slurm: SlurmCluster, users: tuple[User, User], python: str) -> Iterator[Centre]:
    with centre_on(slurm, list(users), python) as c:
        yield c


def test_two_users_share_the_centre_each_with_their_own_rights(
    centre: Centre, users: tuple[User, User], slurm: SlurmCluster
) -> None:
    alice, bob = users
    centre.start()
    # Alice queues two trainers (they take the 8 nodes), then Bob one: by user, Bob's
    # gets as much as Alice's two together.
    a1 = centre.submit(alice)
    a2 = centre.submit(alice)
    b1 = centre.submit(bob)
    mine = {alice.name: (a1, a2), bob.name: (b1,)}
    for user, tids in ((alice, (a1, a2)), (bob, (b1,))):
        for tid in tids:
            wait_until(
                lambda u=user, t=tid: centre.trainer(u, t)["samples_done"] > 0,
                400,
                f"{user.name}'s {tid} training",
            )

    # The split follows the rule: the last decision (Bob's trainer came; re-decisions on
    # curves are off here) gives each user half of the 8 nodes, where by trainer Bob's
    # would get a third.
    assert "fair by user" in centre.allocator_log()
    view = centre.status(bob)["centre"]
    bob_nodes = [t["nodes"] for t in view["trainers"] if "id" in t]
    alice_nodes = [t["nodes"] for t in view["trainers"] if t["user"] == alice.name]
    assert [len(n) for n in bob_nodes] == [4] and sum(alice_nodes) == 4, view
    assert all(n >= 1 for n in alice_nodes), view

    # Every process of a user's trainers runs under that user's uid; so does its agent.
    for user in (alice, bob):
        procs = processes_of(user.state_dir)
        assert len(procs) >= 2, f"{user.name}: found only {procs}"
        assert set(procs.values()) == {user.uid}, f"{user.name}: {procs}"
        agent = daemon_running(user.state_dir)
        assert agent is not None and uid_of(agent) == user.uid
        for tid in mine[user.name]:
            supervisor = int((user.state_dir / "trainers" / tid / "supervisor.pid").read_text())
            assert uid_of(supervisor) == user.uid

    # Each node's holder belongs to the user whose trainer runs there.
    def holders_match() -> bool:
        owners = centre.holders()
        for user in (alice, bob):
            for tid in mine[user.name]:
                for node in centre.trainer(user, tid)["nodes"]:
                    if owners.get(node) != user.name:
                        return False
        return True

    wait_until(holders_match, 60, "each trainer's nodes held by its own user's holders")

    # Another user's trainer: refused, in one line, by the allocator (from the uid).
    for args in (("cancel",), ("status",), ("logs",)):
        done = centre.run(alice, *args, f"{bob.name}/{b1}")
        assert done.returncode != 0
        assert done.stderr.strip().splitlines() == [
            f"Error: refused by the allocator: uid {alice.uid} ({alice.name}) may not "
            f"{'cancel' if args[0] == 'cancel' else 'see'} {bob.name}/{b1}: "
            f"it belongs to {bob.name}"
        ]
    assert centre.trainer(bob, b1)["state"] in ("running", "waiting")  # not cancelled
    # And the files are Bob's alone.
    assert centre.run(alice, "logs", b1, "--state-dir", str(bob.state_dir)).returncode != 0

    # kill -9 of the allocator: the trainers go on; the restarted allocator re-registers
    # them from their agents.
    before = {t: centre.trainer(bob, t)["samples_done"] for t in (b1,)}
    centre.kill9()
    wait_until(
        lambda: centre.trainer(bob, b1)["samples_done"] > before[b1],
        120,
        "Bob's trainer going on without the allocator",
    )
    centre.start()
    restored = centre.logs / "allocator-2.log"
    wait_until(
        lambda: "trainer(s) from their agents" in restored.read_text(),
        60,
        "the allocator restored from the agents",
    )

    # kill -9 of Bob's agent: its trainer goes on; a new agent re-attaches to it.
    agent = daemon_running(bob.state_dir)
    assert agent is not None
    supervisor = int((bob.state_dir / "trainers" / b1 / "supervisor.pid").read_text())
    os.kill(agent, signal.SIGKILL)
    wait_until(lambda: daemon_running(bob.state_dir) is None, 30, "Bob's agent gone")
    progress = centre.trainer(bob, b1)["samples_done"]
    wait_until(
        lambda: reported_samples(bob.state_dir / "trainers" / b1) > progress,
        120,
        "Bob's trainer going on without its agent",
    )
    subprocess.Popen(
        [*centre.bftrainer, "agent", "--socket-dir", str(centre.sockets)],
        env=centre.env(bob),
        user=bob.uid,
        group=bob.gid,
        extra_groups=[],
        cwd=bob.home,
        stdout=subprocess.DEVNULL,
        stderr=(bob.state_dir / "agent.log").open("ab"),
        start_new_session=True,
    )
    wait_until(lambda: daemon_running(bob.state_dir) is not None, 30, "Bob's agent back")
    wait_until(
        lambda: "re-attached to its supervisor" in (bob.state_dir / "agent.log").read_text(),
        60,
        "Bob's new agent re-attached to his trainer",
    )
    assert int((bob.state_dir / "trainers" / b1 / "supervisor.pid").read_text()) == supervisor

    # Every trainer finishes with exactly its work (at full speed from here).
    centre.release()
    for user, tids in ((alice, (a1, a2)), (bob, (b1,))):
        for tid in tids:
            wait_until(
                lambda u=user, t=tid: centre.trainer(u, t)["state"] in ("done", "failed"),
                900,
                f"{user.name}'s {tid} done",
            )
            t = centre.trainer(user, tid)
            assert t["state"] == "done" and t["samples_done"] == WORK, t
    # No process of one user ever ran under the other's uid (checked again at the end).
    for user in (alice, bob):
        assert set(processes_of(user.state_dir).values()) <= {user.uid}


def test_a_silent_agent_loses_its_nodes_after_its_lease_never_before(
    centre: Centre, users: tuple[User, User], slurm: SlurmCluster
) -> None:
    alice, bob = users
    centre.start()
    a1 = centre.submit(alice, max_nodes=8, work=3 * WORK)
    b1 = centre.submit(bob, work=2 * WORK)
    for user, tid in ((alice, a1), (bob, b1)):
        wait_until(
            lambda u=user, t=tid: centre.trainer(u, t)["samples_done"] > 0,
            400,
            f"{user.name}'s {tid} training",
        )

    def assigned(user: User) -> int:
        view = centre.status(user)["centre"]
        return sum(len(t["nodes"]) for t in view["trainers"] if "id" in t)

    wait_until(lambda: assigned(alice) == 4 and assigned(bob) == 4, 120, "the pool split 4/4")
    # Bob's agent stops answering (SIGSTOP): within the lease (20 s) nothing moves; its
    # last sync may be some seconds old already on a loaded machine, so look for 8 s.
    agent = daemon_running(bob.state_dir)
    assert agent is not None
    os.kill(agent, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        while time.monotonic() - stopped < 8:
            assert assigned(alice) == 4, "Bob's nodes were reclaimed before his lease ran out"
            time.sleep(2)
        # Past the lease: Bob's trainer is withdrawn and Alice's is given his nodes.
        wait_until(lambda: assigned(alice) == 8, 60, "Bob's nodes given to Alice")
        assert "has not synced for" in centre.allocator_log()
        # Bob's trainer itself goes on on the nodes it holds (the allocator cannot and
        # does not stop it): his holders are still his.
        owners = centre.holders()
        assert sum(owner == bob.name for owner in owners.values()) >= 1, owners
    finally:
        os.kill(agent, signal.SIGCONT)
    # Bob's agent answers again: registered anew, the pool split again.
    wait_until(lambda: assigned(bob) == 4 and assigned(alice) == 4, 120, "split 4/4 again")
    assert f"{bob.name}/{b1}~1" in centre.allocator_log()
    centre.release()
    for user, tid, work in ((alice, a1, 3 * WORK), (bob, b1, 2 * WORK)):
        wait_until(
            lambda u=user, t=tid: centre.trainer(u, t)["state"] in ("done", "failed"),
            900,
            f"{user.name}'s {tid} done",
        )
        t = centre.trainer(user, tid)
        assert t["state"] == "done" and t["samples_done"] == work, t
