"""The supervisor's backends: how one trainer's workers run on a host set.

:class:`HorovodBackend` runs Elastic Horovod's driver, which follows the host list
through its discovery script; :class:`TorchrunBackend` runs one torchrun agent per host
and starts a new generation on each new host set.

Why torchrun is restarted rather than re-rendezvoused: with c10d rendezvous a grow
needs ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` and a shrink waits for heartbeat
timeouts (about 20 s), the first agent hosts the store (if its host leaves, the job
dies), and every membership change restarts all workers anyway. Stopping the workers
at a step boundary (they commit first: no step is lost) and starting one agent per
new host with a fresh rendezvous is as fast and never depends on the departed host.
Each agent is forked by its host's resident (resident.py), which imported torch once.
c10d rendezvous still forms each generation; a crash ends it (``--max-restarts=0``) and
the supervisor restarts from the last commit.

Settings (environment, e.g. ``LaunchSpec.env``): ``BFTRAINER_HOROVOD_NIC`` (``auto``:
``--network-interface lo`` when every host is this machine; ``none``; or an interface
name), ``BFTRAINER_BLACKLIST_COOLDOWN_S`` (``"5 10"``: a host whose worker failed may
come back after 5-10 s), ``BFTRAINER_STOP_GRACE_S`` (30: how long workers get to
checkpoint and exit, at most an hour: ``base.stop_grace_s``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shlex
import signal
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from subprocess import PIPE, Popen

from bftrainer.trainers import channel, lifeline
from bftrainer.trainers.launch import remote, worker
from bftrainer.trainers.launch.base import LaunchError, LaunchSpec, stop_grace_s
from bftrainer.trainers.launch.resident import Resident, Residents

logger = logging.getLogger("bftrainer.supervisor")

WORKER = ("-m", "bftrainer.trainers.launch.worker")
WORKER_FILE = str(Path(worker.__file__).resolve())  # what torchrun's --run-path runs
Hosts = list[tuple[str, int]]


def env_setting(name: str, default: str) -> str:
    return os.environ.get(name, default)


class Backend:
    """One run of the backend's processes on a host set."""

    name = "backend"

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.dir = spec.trainer_dir
        self.hosts: Hosts = []
        self.procs: list[Popen[bytes]] = []
        self.stopping = False
        self._stop_deadline: float | None = None
        self._killed_at: float | None = None

    def worker_env(self) -> dict[str, str]:
        return {
            **self.spec.env,
            "BFTRAINER_TRAINER_DIR": str(self.dir),
            "BFTRAINER_TRAINER_ID": self.spec.trainer_id,
            "BFTRAINER_BACKEND": self.name,
            "PYTHONUNBUFFERED": "1",
        }

    def worker_argv(self) -> list[str]:
        return [self.spec.python, *WORKER, str(self.spec.script), *self.spec.args]

    def spawn(self, argv: list[str], env: Mapping[str, str], reports: bool = False) -> Popen[bytes]:
        """Start ``argv`` in its own session. Its standard input is a pipe this process
        holds open: a command run over ssh ends when the supervisor does (remote.TETHER);
        and it gets SIGTERM (torchrun and horovodrun then stop their workers) when the
        supervisor dies, by SIGKILL too (lifeline). ``reports``: its standard output is
        a pipe to this process (a resident agent's), not the log."""
        logger.info("starting: %s", shlex.join(argv))
        return Popen(
            argv,
            env={**os.environ, **env},
            stdin=PIPE,
            stdout=PIPE if reports else None,
            start_new_session=True,
            cwd=self.dir,
            preexec_fn=lifeline.tied_to_this_process(),
        )

    def start(self, hosts: Hosts) -> None:
        raise NotImplementedError

    def update(self, hosts: Hosts) -> None:
        raise NotImplementedError

    def request_stop(self, grace_s: float) -> None:
        """Ask the workers to commit and exit; kill them after ``grace_s``."""
        if not self.stopping:
            logger.info("%s: asking the workers to checkpoint and stop", self.name)
            channel.write_text_atomic(self.dir / channel.STOP_REQUEST, f"{time.time()}\n")
            self.stopping = True
            self._stop_deadline = time.monotonic() + grace_s

    def stop_now(self) -> None:
        """End the workers without asking for a commit: for workers with none to make."""
        self.stopping = True
        self.terminate()

    def terminate(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                remote.kill_tree(p.pid, signal.SIGTERM)
        if not remote.wait_gone([p.pid for p in self.procs], 5.0):
            for p in self.procs:
                remote.kill_tree(p.pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=5)

    def exit_codes(self) -> list[int | None]:
        """Each of this run's processes: its exit code, None while it runs."""
        return [p.poll() for p in self.procs]

    def running(self) -> bool:
        return any(c is None for c in self.exit_codes())

    def poll(self) -> int | None:
        """None while running; else the return code (first non-zero, else 0)."""
        late = self._stop_deadline is not None and time.monotonic() > self._stop_deadline
        if late and self._killed_at is None:
            logger.warning("%s: workers did not stop in time; terminating", self.name)
            self._killed_at = time.monotonic()
            self.terminate()
        codes = self.exit_codes()
        if any(c is None for c in codes):
            if any(c not in (None, 0) for c in codes):
                bad = next(c for c in codes if c not in (None, 0))
                logger.warning("%s: a process exited with %s; stopping the rest", self.name, bad)
                self.terminate()
                return bad
            return None
        return next((c for c in codes if c != 0), 0)


class HorovodBackend(Backend):
    """``horovodrun`` in elastic mode; discovery prints the supervisor's host copy."""

    name = "horovod"

    def __init__(self, spec: LaunchSpec) -> None:
        super().__init__(spec)
        self.discovery_hosts = self.dir / channel.DISCOVERY_HOSTS
        self.discovery = self.dir / "discover-hosts.sh"
        self.shim_dir = self.dir / "bin"
        self.nic: str | None = None

    def _choose_nic(self, hosts: Hosts) -> str | None:
        setting = env_setting("BFTRAINER_HOROVOD_NIC", "auto")
        if setting == "none":
            return None
        if setting == "auto":
            return "lo" if all(remote.is_local(h) for h, _ in hosts) else None
        return setting

    def _write_files(self) -> None:
        self.discovery.write_text(f"#!/bin/sh\nexec cat {shlex.quote(str(self.discovery_hosts))}\n")
        self.discovery.chmod(0o755)
        self.shim_dir.mkdir(exist_ok=True)
        shim = self.shim_dir / "ssh"
        shim.write_text(
            f"#!{self.spec.python}\n"
            "# Horovod's ssh calls, run as exec.json says (bftrainer.trainers.launch.remote).\n"
            "import sys\nfrom pathlib import Path\n"
            "from bftrainer.trainers.launch.remote import ssh_shim_main\n"
            f"sys.exit(ssh_shim_main(sys.argv[1:], Path({str(self.dir)!r}), "
            f"Path({str(self.shim_dir)!r})))\n"
        )
        shim.chmod(0o755)

    def _driver(self) -> list[str]:
        """horovodrun, as our driver module runs it (horovod_driver: the hosts read in
        its own process, not by a new interpreter every second)."""
        if importlib.util.find_spec("horovod") is None:
            raise LaunchError("Horovod not found: build it with scripts/build-horovod.sh")
        return [self.spec.python, "-m", "bftrainer.trainers.launch.horovod_driver"]

    def start(self, hosts: Hosts) -> None:
        self._write_files()
        channel.write_text_atomic(self.discovery_hosts, channel.format_hosts(hosts))
        self.hosts = list(hosts)
        self.nic = self._choose_nic(hosts)
        slots = max(s for _, s in hosts)
        max_np = max(self.spec.n_max, len(hosts)) * slots
        np_ = min(sum(s for _, s in hosts), max_np)
        cooldown = env_setting("BFTRAINER_BLACKLIST_COOLDOWN_S", "5 10").split()
        argv = [
            *self._driver(),
            "-np",
            str(np_),
            "--min-np",
            str(min(self.spec.n_min, np_)),
            "--max-np",
            str(max_np),
            "--host-discovery-script",
            str(self.discovery),
            "--blacklist-cooldown-range",
            *cooldown,
        ]
        if self.nic:
            argv += ["--network-interface", self.nic]
        argv += self.worker_argv()
        env = self.worker_env()
        env["PATH"] = f"{self.shim_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        # The file discover-hosts.sh prints, read by the driver itself.
        env[channel.DISCOVERY_HOSTS_VARIABLE] = str(self.discovery_hosts)
        self.procs = [self.spawn(argv, env)]

    def update(self, hosts: Hosts) -> None:
        # ``auto`` chose lo because every host was this machine: a host elsewhere needs
        # a new horovodrun (and interface). A NIC the site named is kept for any host.
        auto_lo = self.nic == "lo" and env_setting("BFTRAINER_HOROVOD_NIC", "auto") == "auto"
        if not hosts or (auto_lo and not all(remote.is_local(h) for h, _ in hosts)):
            self.request_stop(stop_grace_s())
            return
        logger.info("horovod: hosts now %s", hosts)
        channel.write_text_atomic(self.discovery_hosts, channel.format_hosts(hosts))
        self.hosts = list(hosts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class TorchrunBackend(Backend):
    """One torchrun agent per host, forked by the host's resident (resident.py), c10d
    rendezvous, a new generation per host set."""

    name = "torchrun"

    def __init__(self, spec: LaunchSpec, residents: Residents, generation: int) -> None:
        super().__init__(spec)
        self.residents = residents
        self.generation = generation
        self.running_on: list[Resident] = []
        self._records_from = 0  # where this generation's records begin in metrics.jsonl

    def start(self, hosts: Hosts) -> None:
        hosts = hosts[: max(self.spec.n_max, 1)]
        try:
            self._records_from = (self.dir / channel.METRICS).stat().st_size
        except FileNotFoundError:
            self._records_from = 0
        self.hosts = list(hosts)
        first = hosts[0][0]
        config = remote.exec_config(self.dir)
        endpoint = f"{remote.address_of(first, config)}:{_free_port()}"
        env = self.worker_env()
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        self.residents.keep_only([h for h, _ in hosts])
        resident = [
            self.spec.python,
            "-m",
            "bftrainer.trainers.launch.torchrun_agent",
            "--resident",
        ]
        self.running_on = []
        for i, (host, slots) in enumerate(hosts):
            # Its workers find their slots of a shared node by this name (launch/slot_pin.py).
            host_env = {**env, "BFTRAINER_HOST": host}
            command = remote.wrap_command(host, resident, config, env=host_env, cwd=str(self.dir))
            agent = self.residents.get(
                host, command, host_env, lambda argv, e: self.spawn(argv, e, reports=True)
            )
            args = [
                f"--nnodes={len(hosts)}",
                f"--nproc-per-node={slots}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}",
                f"--rdzv-id={self.spec.trainer_id}-{self.generation}",
                f"--rdzv-conf=is_host={1 if i == 0 else 0}",
                # A crash ends the agent; the supervisor restarts from the last commit,
                # within the trainer's one restart budget (restarts.py).
                "--max-restarts=0",
                "--monitor-interval=1",
                # Its per-run directories in the trainer's, not one more in /tmp each
                # time an agent starts (they stay behind when an agent is stopped).
                f"--log-dir={self.dir / 'torchrun'}",
                # Workers are forked from the agent, forked from the resident, which has
                # imported torch already (torchrun_agent.py): one import of torch per
                # host, not per generation and worker, and a node's workers do not each
                # read torch from a shared file system.
                "--run-path",
                "--start-method=fork",
                WORKER_FILE,
                str(self.spec.script),
                *self.spec.args,
            ]
            logger.info("torchrun generation %d on %s: %s", self.generation, host, shlex.join(args))
            agent.start(self.generation, args)
            self.running_on.append(agent)

    def exit_codes(self) -> list[int | None]:
        return [r.exit_code() for r in self.running_on]

    def terminate(self) -> None:
        """SIGTERM to each running agent (it stops its workers), SIGKILL to their trees
        after 5 s, and the resident itself 5 s later if its agent is still not gone."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            running = [r for r in self.running_on if r.exit_code() is None]
            for r in running:
                r.signal(sig)
            deadline = time.monotonic() + 5.0
            while any(r.exit_code() is None for r in running) and time.monotonic() < deadline:
                time.sleep(0.05)
        for r in self.running_on:
            if r.exit_code() is None:
                logger.warning("%s: resident agent did not end its generation; killing it", r.host)
                r.kill()

    def update(self, hosts: Hosts) -> None:
        # Every membership change restarts the workers: stop them at a step boundary
        # (they commit first) and start a new generation on the new set. Workers that
        # have not reset yet (importing, meeting, restoring) have nothing to commit and
        # no step boundary near: they are stopped at once. Waiting for them cost a whole
        # grace (30 s) at a trainer's start, when its nodes come up one after another.
        records, _ = channel.read_metrics(self.dir, self._records_from)
        if any(r.get("kind") == "reset" for r in records):
            self.request_stop(stop_grace_s())
        else:
            logger.info("%s: no reset yet in this generation: stopping it at once", self.name)
            self.stop_now()
