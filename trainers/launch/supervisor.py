"""The detached supervisor of one trainer: owns the backend, follows ``hosts``.

``python -m bftrainer.trainers.launch.supervisor TRAINER_DIR`` (spawned by
:meth:`Launcher.start <bftrainer.trainers.launch.base.Launcher.start>` in its own
session, so it survives the daemon) reads ``spec.json`` and then loops:

* ``hosts`` changed: Horovod gets the new list through its discovery script (a copy of
  ``hosts`` that the supervisor keeps, so that Horovod never sees an empty list);
  torchrun's agents are asked to stop and a new generation starts on the new set;
* ``hosts`` empty (zero hosts): the workers are asked to stop (``stop.request``: they
  commit, rank 0 checkpoints, they exit 0); they start again when hosts come back;
* a worker reports a user error (``failure.json``, from the worker wrapper), or the
  backend ends: ``exit.json`` says done (``result.json`` exists), failed or stopped;
* the backend ends without a user error (workers lost: a node preempted under a
  torchrun agent, a crash): it starts again from the last commit on the hosts it still
  has, within the trainer's one restart budget (``restarts.py``: at most 3 in a row
  without a new commit, shared with the daemon's restarts of a dead supervisor)
  (a restart onto fewer hosts, after a host was lost, is not counted);
* a host is lost when its holder job ends (preempted, released, cancelled by hand, its
  time limit): in ``slurm`` mode the supervisor asks Slurm itself (one ``squeue`` every
  ``BFTRAINER_HOLDER_CHECK_S``, and at once when workers die) and goes on without the
  host, as Elastic Horovod's discovery drops a host, so a trainer shrinks onto the
  nodes it still has even while the daemon is down. It also renews the holder leases
  of its hosts (``exec.json``'s ``leases``), so holders live exactly as long as a
  trainer or the daemon needs them.

A worker that gets SIGTERM (its node is being preempted) commits with the others at the
next step and leaves alone (exit 143, see the runtime); under Horovod the others go on.

SIGTERM (:meth:`Launcher.stop`) stops the workers the same way and ends ``stopped``.

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
checkpoint and exit).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import shlex
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from subprocess import PIPE, Popen
from typing import Any

from bftrainer.trainers import channel, lifeline
from bftrainer.trainers.launch import remote, restarts, worker
from bftrainer.trainers.launch.base import STOP_GRACE, LaunchError, LaunchSpec
from bftrainer.trainers.launch.hostwatch import HostWatch, env_seconds
from bftrainer.trainers.launch.resident import Resident, Residents
from bftrainer.trainers.launch.worker import FAILURE

logger = logging.getLogger("bftrainer.supervisor")

POLL_S = 0.25
# Workers lost without a user error are restarted from the last commit (restarts.py
# bounds how often) after waiting this long for the driver to drop lost hosts.
RESTART_SETTLE_S = 3.0  # BFTRAINER_RESTART_SETTLE_S overrides it
WORKER = ("-m", "bftrainer.trainers.launch.worker")
WORKER_FILE = str(Path(worker.__file__).resolve())  # what torchrun's --run-path runs
Hosts = list[tuple[str, int]]


def _setting(name: str, default: str) -> str:
    return os.environ.get(name, default)


def last_error_line(log: Path, max_bytes: int = 200_000) -> str:
    """The last ``SomeError: message`` line of a log (workers' prefixes removed)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    pattern = re.compile(
        r"^(?:\[\d+\]<std(?:out|err)>:)?\s*((?:[\w.]+\.)?\w*(?:Error|Exception)\b.*)$"
    )
    found = ""
    for line in text.splitlines():
        m = pattern.match(line)
        if m:
            found = m.group(1).strip()
    return found


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
        setting = _setting("BFTRAINER_HOROVOD_NIC", "auto")
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
        cooldown = _setting("BFTRAINER_BLACKLIST_COOLDOWN_S", "5 10").split()
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
        auto_lo = self.nic == "lo" and _setting("BFTRAINER_HOROVOD_NIC", "auto") == "auto"
        if not hosts or (auto_lo and not all(remote.is_local(h) for h, _ in hosts)):
            self.request_stop(float(_setting("BFTRAINER_STOP_GRACE_S", "30")))
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
            self.request_stop(float(_setting("BFTRAINER_STOP_GRACE_S", "30")))
        else:
            logger.info("%s: no reset yet in this generation: stopping it at once", self.name)
            self.stop_now()


class Supervisor:
    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.dir = spec.trainer_dir
        self.backend: Backend | None = None
        self.stop_requested = False
        self.watch = HostWatch(spec.trainer_dir)
        self._bad_hosts_logged = ""
        self.residents = Residents()  # torchrun's, kept across generations
        self.generations = 0

    def _on_signal(self, signum: int, frame: Any) -> None:
        logger.info("signal %d: stopping", signum)
        self.stop_requested = True

    def _grace_s(self) -> float:
        try:
            return float((self.dir / STOP_GRACE).read_text())
        except (OSError, ValueError):
            return float(_setting("BFTRAINER_STOP_GRACE_S", "30"))

    def _read_hosts(self, previous: Hosts) -> Hosts:
        try:
            hosts = channel.read_hosts(self.dir)
        except channel.ChannelError as e:
            if str(e) != self._bad_hosts_logged:
                logger.error("%s; keeping %s", e, previous)
                self._bad_hosts_logged = str(e)
            return previous
        return hosts[: self.spec.n_max]

    def _failure(self) -> str | None:
        data = channel.read_json(self.dir / FAILURE)
        return None if data is None else str(data.get("reason", "a worker failed"))

    def _new_backend(self) -> Backend:
        if self.spec.backend == "horovod":
            return HorovodBackend(self.spec)
        self.generations += 1
        return TorchrunBackend(self.spec, self.residents, self.generations)

    def finish(
        self, state: str, returncode: int | None, reason: str, cause: str | None = None
    ) -> int:
        if self.backend is not None and self.backend.running():
            self.backend.terminate()
        self.residents.close()
        channel.write_exit(self.dir, state, returncode, reason, time.time(), cause)
        (self.dir / channel.STOP_REQUEST).unlink(missing_ok=True)
        logger.info("trainer %s %s: %s", self.spec.trainer_id, state, reason)
        return 0 if state != "failed" else 1

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        channel.write_text_atomic(self.dir / channel.SUPERVISOR_PID, f"{os.getpid()}\n")
        if not Path(self.spec.script).is_file():
            return self.finish(
                "failed", None, f"trainer script not found: {self.spec.script}", "script"
            )
        hosts: Hosts = []
        running = False
        while True:
            hosts = self.watch.usable(self._read_hosts(hosts))
            reason = self._failure()
            if reason is not None:
                rc = None
                if self.backend is not None:
                    self.backend.terminate()
                    rc = self.backend.poll()
                return self.finish("failed", rc, reason, "script")
            if not running:
                if channel.read_result(self.dir) is not None:
                    return self.finish("done", 0, "work done")
                if self.stop_requested:
                    return self.finish("stopped", None, "stopped on request")
                if hosts:
                    (self.dir / channel.STOP_REQUEST).unlink(missing_ok=True)
                    self.backend = self._new_backend()
                    try:
                        self.backend.start(hosts)
                    except (LaunchError, remote.RemoteExecError, OSError) as e:
                        return self.finish("failed", None, str(e), "infrastructure")
                    running = True
            else:
                backend = self.backend
                assert backend is not None
                if self.stop_requested and not backend.stopping:
                    backend.request_stop(self._grace_s())
                rc = backend.poll()
                if rc is not None:
                    running = False
                    if channel.read_result(self.dir) is not None:
                        return self.finish("done", rc, "work done")
                    reason = self._failure()
                    if reason is not None:
                        return self.finish("failed", rc, reason, "script")
                    if self.stop_requested:
                        return self.finish("stopped", rc, "stopped on request")
                    if not backend.stopping:
                        err = last_error_line(self.dir / channel.SUPERVISOR_LOG)
                        why = f"{backend.name} exited with code {rc}" + (f": {err}" if err else "")
                        hosts = self.watch.usable(self._read_hosts(hosts), look_now=True)
                        lost = sorted({h for h, _ in backend.hosts} - {h for h, _ in hosts})
                        if lost:
                            # Not the trainer's fault: go on from the last commit on the
                            # hosts that remain (none: wait for hosts), not counted.
                            logger.warning(
                                "%s after losing %s: going on with %d host(s) from the last commit",
                                why,
                                ", ".join(lost),
                                len(hosts),
                            )
                            time.sleep(env_seconds("BFTRAINER_RESTART_SETTLE_S", RESTART_SETTLE_S))
                            continue
                        if rc == 0:  # the script returned, its work not done: its own doing
                            return self.finish("failed", rc, short_of_work(self.spec), "script")
                        restart = restarts.take(self.dir, why)
                        if not restart.allowed:
                            return self.finish("failed", rc, restart.gave_up(), "restarts")
                        # No user error: workers were lost (a node preempted under them,
                        # a crash). Start again from the last commit, on the hosts the
                        # driver gives once it has seen the loss.
                        logger.warning(
                            "%s; no user error: restarting from the last commit (%d of %d)",
                            why,
                            restart.number,
                            restarts.MAX_RESTARTS,
                        )
                        time.sleep(env_seconds("BFTRAINER_RESTART_SETTLE_S", RESTART_SETTLE_S))
                        continue
                    logger.info(
                        "%s: workers stopped (code %d); hosts now %s", backend.name, rc, hosts
                    )
                elif hosts != backend.hosts and not backend.stopping:
                    backend.update(hosts)
            time.sleep(POLL_S)


def short_of_work(spec: LaunchSpec) -> str:
    """Why a trainer whose workers all exited 0 without a result failed, in one line:
    its samples done (the last metrics record) against those asked (--work-samples)."""
    records, _ = channel.read_metrics(spec.trainer_dir)
    done = next((r["samples_done"] for r in reversed(records) if "samples_done" in r), 0)
    asked = "its work"
    args = list(spec.args)
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if name in ("--work-samples", "--work-epochs"):
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "?")
            unit = "samples" if name == "--work-samples" else "epochs"
            asked = f"{value} {unit} asked"
    return (
        f"the trainer script exited 0 short of its work: {done} samples done, {asked} "
        "(no result.json: it returned before the runtime met its work)"
    )


def main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s supervisor %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    if len(argv) != 1:
        print("usage: python -m bftrainer.trainers.launch.supervisor TRAINER_DIR", file=sys.stderr)
        return 2
    trainer_dir = Path(argv[0])
    spec_path = trainer_dir / channel.SPEC
    try:
        spec = LaunchSpec.from_json(spec_path.read_text(), str(spec_path))
    except (OSError, LaunchError) as e:
        logger.error("%s", e)
        with contextlib.suppress(OSError):
            channel.write_exit(trainer_dir, "failed", None, str(e), time.time(), "infrastructure")
        return 1
    try:
        return Supervisor(spec).run()
    except Exception as e:
        logger.exception("supervisor failed")
        channel.write_exit(
            trainer_dir, "failed", None, f"supervisor error: {e}", time.time(), "infrastructure"
        )
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
