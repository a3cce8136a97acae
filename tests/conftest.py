"""Shared fixtures: a real local Slurm cluster and a real sshd, started or reused.

Both skip (with the reason) where they cannot run: Slurm needs its Debian packages, which
``scripts/slurm/local-cluster.sh`` installs only as root; sshd needs ``/usr/sbin/sshd``.
"""

from __future__ import annotations

import os
import sys

# numpy's OpenBLAS starts a thread per core, and an idle one spins before it sleeps: with
# the suite's 4 workers and their trainers on 2 cores, two small in-process Pollux tests
# took 145 s of wall and 65 s of CPU (276 s in a `make test`), against 2.7 s and 2.7 s
# with one thread. Set before numpy loads; every process the tests start inherits it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# Some images set PYTHONDONTWRITEBYTECODE (this project's machines do): then every Python
# process the suite starts (thousands: commands, daemons, supervisors, trainers) compiled
# bftrainer's sources again, and each xdist worker re-wrote every test module's asserts.
# The suite writes bytecode, as Python does by default: the report and state tests spent
# 79.0 s of CPU without it, 72.3 s with it (their commands 0.56 -> 0.37 s each).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.dont_write_bytecode = False  # this process too (above): the test modules it imports
REPO = Path(__file__).resolve().parents[1]

# A suite started in the background by a shell without job control (`make test &` in a
# script) inherits SIGINT ignored, and so would every process it starts: the Ctrl-C
# tests would then see commands run to the end. Give the children the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
CLUSTER_SCRIPT = REPO / "scripts" / "slurm" / "local-cluster.sh"

# Horovod's background thread negotiates every HOROVOD_CYCLE_TIME ms, even when no tensor
# is ready: a held 3-worker trainer of the example burnt 0.64 of this machine's 2 cores at
# Horovod's default, 0.29 at 10 ms (measured with the harness's hold). Every trainer the
# tests start (daemon's included) inherits this, so the cores go to the tests' work.
os.environ.setdefault("HOROVOD_CYCLE_TIME", "10")
# Gloo's rendezvous waits 30 s by default for the workers a rescale adds, and a new
# worker's imports took longer than that on these 2 loaded cores: a re-forming Horovod job
# failed whole (the daemon's tests at a load average of 12; the 1-3-2-1 rescale test in a
# fresh clone's `make test`, "Wait timeout after 30 seconds for key(s): 1"). The daemon's
# harness sets the same for the benchmarks, which run without this file.
os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", "120")


# Tests whose trainers train flat out on several local worker processes: under
# pytest-xdist (`--dist loadgroup`, as `make test` runs it) each group runs on one worker,
# one test at a time, so that no two of a group starve each other on a 2-core machine
# (Horovod's and Gloo's timeouts then fire). Two groups: together they took about 20 min
# of a loaded 4-worker run, too long for one worker.
TORCH_GROUPS = {
    "test_elastic_horovod": "torch-a",
    "test_elastic_remote": "torch-a",
    "test_run_trainer_dir": "torch-a",
    "test_elastic_torchrun": "torch-b",
    "test_elastic_errors": "torch-b",
    "test_slots_pin": "torch-b",
    "test_gpu_check": "torch-b",
}


SLOWEST = REPO / "tests" / "slowest.txt"


def measured_s() -> dict[str, float]:
    """Test id -> seconds, from tests/slowest.txt."""
    out: dict[str, float] = {}
    for line in SLOWEST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            seconds, nodeid = line.split(maxsplit=1)
            out[nodeid] = float(seconds)
    return out


# tryfirst: pytest-xdist's worker turns a group mark into the test's id in the same hook;
# run after it, the marks come too late and no group holds (tests/test_suite_groups.py).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = TORCH_GROUPS.get(item.path.stem)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # Longest first (xdist hands tests out in this order, after the groups): a long test
    # that starts last makes the whole run wait for it alone.
    seconds = measured_s()
    items.sort(key=lambda item: -seconds.get(item.nodeid, 0.0))


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` until true; fail naming ``what`` after ``timeout_s``.

    Polls every 0.25 s, or twice as long as the predicate itself took: a predicate that
    runs a command (``bftrainer status``: 0.1-0.35 s of CPU) then spends at most a third
    of a core, not most of one, while the test waits on 2 shared cores."""
    deadline = time.monotonic() + timeout_s
    while True:
        started = time.monotonic()
        if predicate():
            return
        now = time.monotonic()
        if now >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(min(max(0.25, 2 * (now - started)), deadline - now))


def bftrainer(
    *args: str | Path, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m bftrainer ARGS`` as a user runs it, this checkout's code (PYTHONPATH),
    its output as text, whatever its exit. The timeout only stops a hang: ``report``
    draws with matplotlib, which took over 60 s on 2 cores at load 16."""
    return subprocess.run(
        [sys.executable, "-m", "bftrainer", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    """The one ``Error`` line of a command that failed without a traceback."""
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("Error")]
    return line


# ---------------------------------------------------------------------- Slurm


@dataclass
class SlurmCluster:
    """A running local cluster: ``env`` has SLURM_CONF; helpers run Slurm's commands."""

    conf: Path
    nodes: tuple[str, ...]
    started_here: bool

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    @property
    def bf_interval_s(self) -> float:
        """Seconds between two backfill passes, from its slurm.conf."""
        match = re.search(r"bf_interval=(\d+)", self.conf.read_text())
        return float(match.group(1)) if match else 30.0  # Slurm's default

    def run(self, argv: Sequence[str], check: bool = True) -> str:
        done = subprocess.run(
            list(argv),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def sbatch(self, *args: str) -> str:
        """Submit ``sleep`` work; returns the job id."""
        out = self.run(["sbatch", "--parsable", "-o", "/dev/null", *args])
        return out.strip().split(";")[0]

    def states(self) -> dict[str, str]:
        out = self.run(["sinfo", "-N", "-h", "-o", "%N|%T"])
        return dict(line.split("|") for line in out.split())

    def jobs(self) -> set[str]:
        """The ids of every job the cluster still knows (any user, any state but gone)."""
        return set(self.run(["squeue", "-h", "-o", "%i"], check=False).split())

    def reset(self, keep: frozenset[str] = frozenset()) -> None:
        """Cancel every job but ``keep``, drop reservations, resume nodes; wait until no
        job but ``keep`` is left and every node is idle (``keep`` empty) or answers."""
        ours = sorted(self.jobs() - keep)
        if ours:
            self.run(["scancel", "--full", *ours], check=False)
        for line in self.run(["scontrol", "show", "res", "-o"], check=False).splitlines():
            if line.startswith("ReservationName="):
                name = line.split()[0].split("=", 1)[1]
                self.run(["scontrol", "delete", f"reservation={name}"], check=False)
        for node, state in self.states().items():
            if state.startswith(("drain", "down")):
                self.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        wait_until(
            lambda: (
                not (self.jobs() - keep)
                and (bool(keep) or all(s == "idle" for s in self.states().values()))
            ),
            40,
            "the test's jobs gone and all nodes idle",
        )


def worker_cluster_env() -> dict[str, str]:
    """``local-cluster.sh``'s settings for this pytest-xdist worker's own cluster: its
    folder and ports keyed on the worker's id, so that workers run cluster tests side by
    side, each on a cluster no other test touches. Empty outside xdist: the default
    cluster (a developer's running one is reused)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return {}
    base = 20000 + 100 * int(worker[2:])  # below Linux's ephemeral ports (32768-)
    return {
        "SLURM_LOCAL_DIR": f"/var/tmp/bftrainer-slurm-{worker}",
        "SLURM_LOCAL_CTLD_PORT": str(base),
        "SLURM_LOCAL_SLURMD_PORT": str(base + 1),
        "SLURM_LOCAL_NODE_PORT": str(base + 10),  # node i on base + 10 + i
        # Shorter than a developer's cluster (5 and 10): planned starts appear sooner,
        # and a job step that ignores SIGTERM is killed sooner.
        "SLURM_LOCAL_BF_INTERVAL": "2",
        "SLURM_LOCAL_KILL_WAIT": "3",
    }


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start the local cluster (or reuse a running one); stop it only if started here.
    Under pytest-xdist each worker has a cluster of its own (:func:`worker_cluster_env`)."""
    if not CLUSTER_SCRIPT.exists():
        pytest.skip(f"{CLUSTER_SCRIPT} is missing")
    env = {**os.environ, **worker_cluster_env()}
    status = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), "status"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    started_here = status.returncode != 0
    if started_here:
        if os.geteuid() != 0 and not shutil.which("slurmctld"):
            pytest.skip("Slurm is not installed and installing it needs root")
        done = subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), "start"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env=env,
        )
        if done.returncode == 3:
            pytest.skip(f"no local Slurm: {done.stderr.strip().splitlines()[-1]}")
        if done.returncode != 0:
            pytest.fail(f"local-cluster.sh start failed ({done.returncode}): {done.stderr}")
        out = done.stdout
    else:
        out = status.stdout
    conf = Path(out.strip().splitlines()[-1].split("=", 1)[1])
    nnodes = int(os.environ.get("NNODES", "8"))
    cluster = SlurmCluster(conf, tuple(f"node{i}" for i in range(1, nnodes + 1)), started_here)
    try:
        yield cluster
    finally:
        if started_here:
            subprocess.run(
                ["bash", str(CLUSTER_SCRIPT), "stop"], capture_output=True, check=False, env=env
            )


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster, clean (no jobs, no reservations, all idle) before the test; after it,
    the jobs it started (submitted by the test or by what it ran) are cancelled, and only
    those. Under pytest-xdist the cluster is the worker's own (one test at a time), so
    before a test it holds nothing but what an earlier, failed clean-up left."""
    slurm_cluster.reset()
    before = frozenset(slurm_cluster.jobs())
    yield slurm_cluster
    slurm_cluster.reset(keep=before)


# ---------------------------------------------------------------------- a full disk


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs (a full disk for the tests of one; root only), unmounted after."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# ---------------------------------------------------------------------- sshd


@dataclass(frozen=True)
class SshServer:
    """A real sshd on 127.0.0.1: log in as ``user`` with ``key``, checked by ``known_hosts``."""

    host: str
    port: int
    user: str
    key: Path
    known_hosts: Path
    host_public_key: str

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """sshd on a free high port with its own config and keys under a temp dir."""
    sshd_bin = shutil.which("sshd") or "/usr/sbin/sshd"
    keygen = shutil.which("ssh-keygen")
    if not Path(sshd_bin).exists() or keygen is None:
        pytest.skip("sshd or ssh-keygen is not installed (apt-get install openssh-server)")
    d = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "client_key"):
        subprocess.run(
            [keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)],
            check=True,
            capture_output=True,
        )
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    (d / "authorized_keys").chmod(0o600)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
    port = _free_port()
    config = d / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {d / 'host_key'}",
                f"PidFile {d / 'sshd.pid'}",
                f"AuthorizedKeysFile {d / 'authorized_keys'}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    log = (d / "sshd.log").open("w")
    proc = subprocess.Popen(
        [sshd_bin, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
    )

    def accepting() -> bool:
        if proc.poll() is not None:
            return True
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(accepting, 10, f"sshd on port {port}")
        if proc.poll() is not None:
            pytest.skip(f"sshd did not start: {(d / 'sshd.log').read_text().strip()[:300]}")
        host_pub = (d / "host_key.pub").read_text().split()
        known = d / "known_hosts"
        known.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
        user = (
            os.environ.get("USER")
            or subprocess.run(
                ["id", "-un"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
        yield SshServer("127.0.0.1", port, user, d / "client_key", known, " ".join(host_pub[:2]))
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)
        log.close()
