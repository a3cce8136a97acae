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

How each backend runs its workers (Horovod's elastic driver, torchrun's generations):
``backends.py``. ``BFTRAINER_STOP_GRACE_S`` (30: how long workers get to checkpoint and
exit; at most an hour).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bftrainer.trainers import channel
from bftrainer.trainers.launch import remote, restarts
from bftrainer.trainers.launch.backends import (
    Backend,
    HorovodBackend,
    Hosts,
    TorchrunBackend,
)
from bftrainer.trainers.launch.base import STOP_GRACE, LaunchError, LaunchSpec, stop_grace_s
from bftrainer.trainers.launch.hostwatch import HostWatch, env_seconds
from bftrainer.trainers.launch.resident import Residents
from bftrainer.trainers.launch.worker import FAILURE

logger = logging.getLogger("bftrainer.supervisor")

POLL_S = 0.25
# Workers lost without a user error are restarted from the last commit (restarts.py
# bounds how often) after waiting this long for the driver to drop lost hosts.
RESTART_SETTLE_S = 3.0  # BFTRAINER_RESTART_SETTLE_S overrides it


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
            given: str | None = (self.dir / STOP_GRACE).read_text().strip()
        except (OSError, ValueError):
            given = None
        return stop_grace_s(given)

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
