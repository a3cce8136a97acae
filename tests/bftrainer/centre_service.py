"""A centre run by a test or a benchmark: the allocator (as root, the centre's account),
real Unix accounts made for the run, and their commands run as themselves through the
socket; everything cleaned up by PID, and only the run's own accounts and jobs.

Used by tests/bftrainer/test_centre_e2e.py and the multi-user soak
(tests/bftrainer/centre_soak.py, benchmarks/centre_soak.py).
"""

from __future__ import annotations

import compileall
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bftrainer.state import daemon_running
from bftrainer.trainers.launch.base import Launcher, LaunchError
from tests.conftest import REPO, SlurmCluster, wait_until

EXAMPLE = REPO / "examples" / "train_mlp.py"
# Fair by user, no re-decision on curves: the fairness rule alone decides the split.
# The agents' lease is short (production: 60 s) so that the silent-agent test waits 20 s
# for it, not a minute. Agents sync every second, but at load 15 an agent's last sync
# before it was stopped was seen up to 6 s old: the test checks the first 8 s only.
CONFIG = (
    '[policy]\nobjective = "speedup"\nfair_by = "user"\nfairness_p = -1.0\n'
    "fair_share_speedup = true\n"
    "redecide_every_s = 3600.0\n"
    "[daemon]\nsync_every_s = 1.0\nagent_lease_s = 20.0\nholder_lease_s = 120.0\n"
)


class NoAccounts(Exception):
    """The run cannot make its Unix accounts or give them an interpreter (the reason)."""


def runnable_by_all(path: Path) -> bool:
    """Whether every account can run ``path`` (each folder above it searchable)."""
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents))


def readable_by_all(folder: Path) -> bool:
    """Whether every account can read the tree ``folder`` (each folder above it
    searchable; it and every folder in it listable, every file in it readable)."""
    if not all(p.stat().st_mode & 0o001 for p in folder.parents):
        return False
    for top, _dirs, files in os.walk(folder):
        if os.stat(top).st_mode & 0o005 != 0o005:
            return False
        for name in files:
            path = os.path.join(top, name)
            if not os.path.islink(path) and not os.stat(path).st_mode & 0o004:
                return False
    return True


def _public_tree(src: Path, dst: Path, *, link: bool) -> None:
    """``src`` as ``dst``, every folder 0755 and every file readable by all: files that
    are already readable by all are hard links when ``link`` (no copy of gigabytes of
    wheels), the others copies; nothing of ``src`` changes."""
    for top, dirs, files in os.walk(src):
        out = dst / Path(top).relative_to(src)
        out.mkdir(mode=0o755, exist_ok=True)
        out.chmod(0o755)
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            source, target = Path(top) / name, out / name
            if source.is_symlink():
                continue
            mode = source.stat().st_mode
            if link and mode & 0o004:
                try:
                    os.link(source, target)
                    continue
                except OSError:  # another file system
                    pass
            shutil.copyfile(source, target)
            target.chmod(0o755 if mode & 0o100 else 0o644)


def _public_install(folder: Path) -> Path:
    """This installation copied into ``folder`` where every account can read it, for a
    clone that only its owner can read (``mktemp -d``, /root: 0700): the virtualenv's
    packages (hard links), bftrainer's sources as the wheel lays them out
    (pyproject.toml's package-dir, instead of the editable install that points into the
    clone) and the examples. Its site folder."""
    site = folder / "site"
    packages = Path(sysconfig.get_paths()["purelib"])
    _public_tree(packages, site, link=True)
    for editable in site.glob("__editable__*"):
        editable.unlink()
    layout = {
        "bftrainer": "bftrainer",
        "bftrainer/milp": "milp",
        "bftrainer/idle_monitor": "idle_monitor",
        "bftrainer/trainers": "trainers",
        "bftrainer/scripts": "scripts",
    }
    for where, source in layout.items():
        _public_tree(REPO / source, site / where, link=False)
    _public_tree(REPO / "examples", folder / "examples", link=False)
    # Compiled here: the accounts that run the copy cannot write its bytecode.
    compileall.compile_dir(site / "bftrainer", quiet=1)
    return site


@contextlib.contextmanager
def python_for_all() -> Iterator[str]:
    """An interpreter with this installation that every account can run: this one, or
    (when it, its packages or this clone live where only their owner can enter, as
    pyenv's under /root or a clone in ``mktemp -d``) a venv of the system's Python of the
    same version that loads a readable copy of them (:func:`_public_install`); the
    trainer example to submit with it is :func:`example_for`."""
    packages = Path(sysconfig.get_paths()["purelib"])
    clone_readable = readable_by_all(REPO / "bftrainer") and readable_by_all(REPO / "examples")
    here = Path(sys.executable)
    runnable = runnable_by_all(here) and runnable_by_all(here.resolve())
    if runnable and readable_by_all(packages) and clone_readable:
        yield sys.executable
        return
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(name, path="/usr/bin:/usr/local/bin")
    if system is None or not runnable_by_all(Path(system).resolve()):
        raise NoAccounts(f"no {name} that every account can run")
    folder = Path(tempfile.mkdtemp(prefix="bft-centre-python-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        subprocess.run([system, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
        site_dir = folder / "venv" / "lib" / name / "site-packages"
        if readable_by_all(packages) and clone_readable:
            loaded = packages
        else:
            loaded = _public_install(folder)
        (site_dir / "bftrainer-test.pth").write_text(
            f"import site; site.addsitedir({str(loaded)!r})\n"
        )
        yield str(folder / "venv" / "bin" / "python")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def example_for(python: str) -> Path:
    """The trainer example that the accounts running ``python`` can read: the copy made
    with it (:func:`python_for_all`), else the clone's."""
    copy = Path(python).parents[2] / "examples" / EXAMPLE.name
    return copy if copy.is_file() else EXAMPLE


WORK = 60_000
STEP_DELAY_S = "0.2"
# Free rescales for the allocator: the fairness rule alone decides the split (with the
# backend's costs, a decision right after a start moves nodes only if the look-ahead,
# short then, pays for it).
FREE = ("--rescale-up", "0", "--rescale-down", "0")


def submit_args(max_nodes: int, work: int, hold: Path, example: Path = EXAMPLE) -> list[str]:
    """``bftrainer submit`` of the example on 1 to ``max_nodes`` nodes, slowed down while
    the file ``hold`` exists (every user must be able to see it)."""
    return [
        "submit", str(example), "--backend", "torchrun", "--min-nodes", "1",
        "--max-nodes", str(max_nodes), "--work-samples", str(work),
        "--step-delay-s", STEP_DELAY_S, "--hold-file", str(hold), "--max-batch", "128",
    ]  # fmt: skip


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
        self.example = example_for(python)  # the users can read it (a 0700 clone's copy)
        self.cluster = cluster
        self.conf = conf  # a copy of slurm.conf every user can read
        self.sockets = sockets
        self.logs = logs
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.config = CONFIG  # the allocator's configuration file, as text
        # Trainers sleep per step while this file exists (in the socket directory, which
        # every user can search): still running while the test watches; release() lets
        # them finish at full speed.
        self.hold = sockets / "hold"
        self.hold.touch()

    def release(self) -> None:
        self.hold.unlink(missing_ok=True)

    def env(self, user: User | None = None) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "SLURM_CONF": str(self.conf),
            "BFTRAINER_HOROVOD_NIC": "lo",
            "HOROVOD_START_TIMEOUT": "120",
        }
        if self.example == EXAMPLE:  # the clone itself is readable and runs as it is
            env["PYTHONPATH"] = str(REPO)
        if user is not None:
            env.update(HOME=str(user.home), USER=user.name, LOGNAME=user.name)
        return env

    def start(self) -> None:
        self.starts += 1
        config = self.logs / "centre.toml"
        config.write_text(self.config)
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
            # Not the clone: `python -m` would import its bftrainer/ folder first, which
            # is not the installed layout (bftrainer.trainers is trainers/ there).
            cwd=self.sockets,
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
        out = self.ok(user, *submit_args(max_nodes, work, self.hold, self.example), *FREE)
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


@contextlib.contextmanager
def accounts(cluster: SlurmCluster, count: int) -> Iterator[list[User]]:
    """``count`` new Unix accounts (``bft<random>a``, ``b``, ...), deleted at the end with
    whatever they left (:func:`drop_user`)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        raise NoAccounts("creating the run's Unix accounts needs root and useradd")
    prefix = f"bft{secrets.token_hex(3)}"
    made: list[User] = []
    try:
        for tag in "abcdefgh"[:count]:
            made.append(make_user(prefix, tag))
        yield made
    finally:
        for user in made:
            drop_user(cluster, user)


@contextlib.contextmanager
def centre_on(
    cluster: SlurmCluster, users: list[User], python: str, logs: Path | None = None
) -> Iterator[Centre]:
    """A :class:`Centre` (not started) on ``cluster``; at the end, the allocator killed,
    the logs printed and the run's folders removed (``logs`` is kept when given)."""
    # The socket directory: root's, 0755, on a path every user can reach (not pytest's
    # tmp_path, which is root's alone).
    sockets = Path(tempfile.mkdtemp(prefix="bft-centre-", dir="/tmp"))
    sockets.chmod(0o755)
    own_logs = logs is None
    logs = Path(tempfile.mkdtemp(prefix="bft-centre-logs-")) if logs is None else logs
    # The local cluster's directory is root's alone (0700): its users read a copy of
    # slurm.conf, as a centre's users read /etc/slurm/slurm.conf.
    public = Path(tempfile.mkdtemp(prefix="bft-centre-conf-", dir="/tmp"))
    public.chmod(0o755)
    conf = public / "slurm.conf"
    shutil.copyfile(cluster.conf, conf)
    conf.chmod(0o644)
    # Slurm runs a job's script from its spool, inside the local cluster's folder: as
    # at a centre, the users must be able to reach it (searchable, not listable).
    cluster_dir = cluster.conf.parent
    was = cluster_dir.stat().st_mode & 0o777
    cluster_dir.chmod(was | 0o011)
    c = Centre(cluster, sockets, logs, conf, python)
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
        for folder in (sockets, public, *((logs,) if own_logs else ())):
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
