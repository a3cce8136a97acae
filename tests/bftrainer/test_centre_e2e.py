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

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bftrainer.state import daemon_running
from bftrainer.trainers.launch.base import Launcher, LaunchError
from tests.conftest import REPO, SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

EXAMPLE = REPO / "examples" / "train_mlp.py"


def runnable_by_all(path: Path) -> bool:
    """Whether every account can run ``path`` (each folder above it searchable)."""
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents))


@pytest.fixture(scope="module")
def python() -> Iterator[str]:
    """An interpreter with this installation that every account can run: this one, or
    (when it lives where only its owner can enter, as pyenv's under /root) a venv of the
    system's Python of the same version that loads this venv's packages."""
    if runnable_by_all(Path(sys.executable).resolve()):
        yield sys.executable
        return
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(name, path="/usr/bin:/usr/local/bin")
    if system is None or not runnable_by_all(Path(system).resolve()):
        pytest.skip(f"no {name} that every account can run")
    folder = Path(tempfile.mkdtemp(prefix="bft-centre-python-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        subprocess.run([system, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
        site_dir = folder / "venv" / "lib" / name / "site-packages"
        packages = sysconfig.get_paths()["purelib"]
        loader = f"import site; site.addsitedir({packages!r})\n"
        (site_dir / "bftrainer-test.pth").write_text(loader)
        yield str(folder / "venv" / "bin" / "python")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


WORK = 60_000
SLOW = ("--step-delay-s", "0.1", "--max-batch", "128")
# Free rescales for the allocator: the fairness rule alone decides the split (with the
# backend's costs, a decision right after a start moves nodes only if the look-ahead,
# short then, pays for it).
FREE = ("--rescale-up", "0", "--rescale-down", "0")


@dataclass
class User:
    name: str
    uid: int
    gid: int
    home: Path

    @property
    def state_dir(self) -> Path:
        return self.home / ".local" / "state" / "bftrainer"


class Centre:
    """The allocator (as root) and the users' commands (as themselves); cleans up what
    it started, by PID, and only the test's own accounts' jobs."""

    def __init__(
        self, cluster: SlurmCluster, sockets: Path, logs: Path, conf: Path, python: str
    ) -> None:
        self.bftrainer = [python, "-m", "bftrainer"]
        self.cluster = cluster
        self.conf = conf  # a copy of slurm.conf every user can read
        self.sockets = sockets
        self.logs = logs
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def env(self, user: User | None = None) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "SLURM_CONF": str(self.conf),
            "PYTHONPATH": str(REPO),
            "BFTRAINER_HOROVOD_NIC": "lo",
            "HOROVOD_START_TIMEOUT": "120",
        }
        if user is not None:
            env.update(HOME=str(user.home), USER=user.name, LOGNAME=user.name)
        return env

    def start(self) -> None:
        self.starts += 1
        config = self.logs / "centre.toml"
        config.write_text(
            '[policy]\nobjective = "speedup"\nfair_by = "user"\nfairness_p = -1.0\n'
            "fair_share_speedup = true\n"
            "redecide_every_s = 3600.0\n"
            "[daemon]\nsync_every_s = 1.0\nagent_lease_s = 30.0\nholder_lease_s = 120.0\n"
        )
        log = (self.logs / f"allocator-{self.starts}.log").open("ab")
        self.proc = subprocess.Popen(
            [
                *self.bftrainer,
                "daemon",
                "--centre",
                "--socket-dir",
                str(self.sockets),
                "--scheduler",
                "slurm",
                "--bf-partition",
                "bf",
                "--env",
                f"SLURM_CONF={self.conf}",
                "--config",
                str(config),
                "--poll-interval",
                "1",
                "--horizon",
                "0",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env(),
            start_new_session=True,
        )
        log.close()
        wait_until(lambda: (self.sockets / "centre.sock").exists(), 30, "the allocator's socket")

    def allocator_log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.logs.glob("allocator-*.log")))

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def run(self, user: User, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.bftrainer, *args],
            capture_output=True,
            text=True,
            env={**self.env(user), "BFTRAINER_SOCKET_DIR": str(self.sockets)},
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            cwd=user.home,
            timeout=120,
            check=False,
        )

    def ok(self, user: User, *args: str) -> str:
        done = self.run(user, *args)
        assert done.returncode == 0, f"{user.name}: bftrainer {' '.join(args)}: {done.stderr}"
        return done.stdout

    def submit(self, user: User, max_nodes: int = 4, work: int = WORK) -> str:
        out = self.ok(
            user,
            "submit",
            str(EXAMPLE),
            "--backend",
            "torchrun",
            "--min-nodes",
            "1",
            "--max-nodes",
            str(max_nodes),
            "--work-samples",
            str(work),
            *FREE,
            *SLOW,
        )
        return out.strip().splitlines()[-1]

    def status(self, user: User) -> dict[str, Any]:
        return json.loads(self.ok(user, "status", "--json"))

    def trainer(self, user: User, tid: str) -> dict[str, Any]:
        return next(t for t in self.status(user)["trainers"] if t["id"] == tid)

    def holders(self) -> dict[str, str]:
        """node -> the user of the bf job running there."""
        out = self.cluster.run(["squeue", "-h", "-p", "bf", "-t", "R", "-o", "%u|%N"])
        owners = {}
        for line in out.splitlines():
            who, _, node = line.partition("|")
            owners[node.strip()] = who.strip()
        return owners


def make_user(prefix: str, tag: str) -> User:
    name = f"{prefix}{tag}"
    subprocess.run(["useradd", "-m", "-U", "-s", "/bin/bash", name], check=True)
    pw = pwd.getpwnam(name)
    return User(name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir))


def drop_user(cluster: SlurmCluster, user: User) -> None:
    """Stop what the test's account left (its agent and supervisors, by PID; its jobs),
    then delete the account and its home."""
    pid = daemon_running(user.state_dir) if user.state_dir.is_dir() else None
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid_file in (user.state_dir / "trainers").glob("*/supervisor.pid"):
        with contextlib.suppress(LaunchError):
            Launcher.attach(pid_file.parent).kill()
    cluster.run(["scancel", "-u", user.name], check=False)
    with contextlib.suppress(Exception):  # the account goes, whatever is left
        wait_until(
            lambda: not cluster.run(["squeue", "-h", "-u", user.name], check=False).strip(),
            60,
            f"{user.name}'s jobs gone",
        )
    subprocess.run(["userdel", "-r", "-f", user.name], capture_output=True, check=False)


@pytest.fixture
def users(slurm: SlurmCluster) -> Iterator[tuple[User, User]]:
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("creating the test's Unix accounts needs root and useradd")
    prefix = f"bft{secrets.token_hex(3)}"
    made: list[User] = []
    try:
        made.append(make_user(prefix, "a"))
        made.append(make_user(prefix, "b"))
        yield made[0], made[1]
    finally:
        for user in made:
            drop_user(slurm, user)


@pytest.fixture
def centre(slurm: SlurmCluster, users: tuple[User, User], python: str) -> Iterator[Centre]:
    # The socket directory: root's, 0755, on a path every user can reach (not pytest's
    # tmp_path, which is root's alone).
    sockets = Path(tempfile.mkdtemp(prefix="bft-centre-", dir="/tmp"))
    sockets.chmod(0o755)
    logs = Path(tempfile.mkdtemp(prefix="bft-centre-logs-"))
    # The local cluster's directory is root's alone (0700): its users read a copy of
    # slurm.conf, as a centre's users read /etc/slurm/slurm.conf.
    public = Path(tempfile.mkdtemp(prefix="bft-centre-conf-", dir="/tmp"))
    public.chmod(0o755)
    conf = public / "slurm.conf"
    shutil.copyfile(slurm.conf, conf)
    conf.chmod(0o644)
    # Slurm runs a job's script from its spool, inside the local cluster's folder: as
    # at a centre, the users must be able to reach it (searchable, not listable).
    cluster_dir = slurm.conf.parent
    was = cluster_dir.stat().st_mode & 0o777
    cluster_dir.chmod(was | 0o011)
    c = Centre(slurm, sockets, logs, conf, python)
    try:
        yield c
    finally:
        cluster_dir.chmod(was)
        if c.proc is not None and c.proc.poll() is None:
            os.killpg(c.proc.pid, signal.SIGKILL)
            c.proc.wait(timeout=10)
        for user in users:
            agent_log = user.state_dir / "agent.log"
            if agent_log.exists():
                print(f"==== {user.name}'s agent.log\n{agent_log.read_text()[-6000:]}")
        print(f"==== allocator\n{c.allocator_log()[-8000:]}")
        for folder in (sockets, logs, public):
            shutil.rmtree(folder, ignore_errors=True)


def processes_of(state_dir: Path) -> dict[int, int]:
    """pid -> real uid of every process working for a trainer of ``state_dir`` (its
    environment names a trainer directory there), from /proc."""
    out = {}
    marker = f"BFTRAINER_TRAINER_DIR={state_dir}/".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker not in (proc / "environ").read_bytes():
                continue
            status = (proc / "status").read_text()
        except OSError:
            continue
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        out[int(proc.name)] = int(uid_line.split()[1])
    return out


def reported_samples(trainer_dir: Path) -> int:
    """The most samples the trainer reported in its metrics file (read as root)."""
    best = 0
    for line in (trainer_dir / "metrics.jsonl").read_text().splitlines():
        with contextlib.suppress(ValueError):
            best = max(best, int(json.loads(line).get("samples_done", 0)))
    return best


def uid_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("Uid:")).split()[1])


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

    # Every trainer finishes with exactly its work.
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
    # Bob's agent stops answering (SIGSTOP): for the lease (30 s) nothing moves.
    agent = daemon_running(bob.state_dir)
    assert agent is not None
    os.kill(agent, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        while time.monotonic() - stopped < 20:
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
    for user, tid, work in ((alice, a1, 3 * WORK), (bob, b1, 2 * WORK)):
        wait_until(
            lambda u=user, t=tid: centre.trainer(u, t)["state"] in ("done", "failed"),
            900,
            f"{user.name}'s {tid} done",
        )
        t = centre.trainer(user, tid)
        assert t["state"] == "done" and t["samples_done"] == work, t
