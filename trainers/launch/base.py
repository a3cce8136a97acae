"""The launcher interface: start a trainer on hosts, change them, stop it, poll it.

One :class:`Launcher` for every backend: it writes the trainer directory's ``spec.json``
and ``hosts`` and spawns the detached supervisor
(``python -m bftrainer.trainers.launch.supervisor TRAINER_DIR``), which owns the backend
(Horovod or torchrun) and survives its caller. Everything after the start goes through
files in the trainer directory (docs/trainers.md, "The trainer directory"), so a
restarted daemon :meth:`attach`-es to a running trainer from ``supervisor.pid``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bftrainer.common.names import BadNameError, check_trainer_id, open_regular
from bftrainer.trainers import channel, lifeline
from bftrainer.trainers.launch import remote

logger = logging.getLogger(__name__)

BACKENDS = ("horovod", "torchrun")
STOP_GRACE = "stop.grace"  # Launcher.stop's grace for the supervisor, in seconds
# How long workers get to checkpoint and exit when stopped; longer than the bound is a
# hang, not a checkpoint (``run --stop-grace-s``, ``stop.grace``, BFTRAINER_STOP_GRACE_S).
DEFAULT_STOP_GRACE_S = 30.0
MAX_STOP_GRACE_S = 3600.0
# The module every supervisor runs as (Launcher.start; Launcher.running_in looks for it).
SUPERVISOR_MODULE = "bftrainer.trainers.launch.supervisor"


class LaunchError(RuntimeError):
    """A trainer that cannot be launched or attached (names what and where)."""


@dataclass(frozen=True)
class LaunchSpec:
    trainer_id: str
    script: Path  # the user's trainer.py
    args: tuple[str, ...]  # its arguments (the runtime's --work-samples etc. among them)
    trainer_dir: Path
    backend: str  # "horovod" | "torchrun"
    n_min: int = 1
    n_max: int = 1
    python: str = sys.executable
    env: Mapping[str, str] = field(default_factory=dict)
    # The script's content when launched (hex SHA-256; "": not recorded): part of the
    # work's identity, so that an edited script is new work (bftrainer run).
    script_sha256: str = ""

    def to_json(self) -> str:
        data = asdict(self)
        data.update(
            script=str(self.script),
            trainer_dir=str(self.trainer_dir),
            args=list(self.args),
            env=dict(self.env),
        )
        return json.dumps(data, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str, source: str = "<spec>") -> LaunchSpec:
        try:
            d = json.loads(text)
            spec = cls(
                trainer_id=str(d["trainer_id"]),
                script=Path(d["script"]),
                args=tuple(str(a) for a in d["args"]),
                trainer_dir=Path(d["trainer_dir"]),
                backend=str(d["backend"]),
                # A spec written before issue 43 names them min_hosts, max_hosts.
                n_min=int(d["n_min"] if "n_min" in d else d["min_hosts"]),
                n_max=int(d["n_max"] if "n_max" in d else d["max_hosts"]),
                python=str(d["python"]),
                env={str(k): str(v) for k, v in d["env"].items()},
                script_sha256=str(d.get("script_sha256", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise LaunchError(f"{source}: not a launch spec: {e!r}") from None
        spec.check()
        return spec

    def check(self) -> None:
        """Raise :class:`LaunchError` naming the first field that cannot work."""
        try:
            check_trainer_id(self.trainer_id, "trainer id")
        except BadNameError as e:
            raise LaunchError(str(e)) from None
        if self.backend not in BACKENDS:
            raise LaunchError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if not 1 <= self.n_min <= self.n_max:
            raise LaunchError(f"need 1 <= n_min <= n_max, got {self.n_min}, {self.n_max}")
        if not Path(self.script).is_file():
            raise LaunchError(f"trainer script not found: {self.script}")


@dataclass(frozen=True)
class TrainerExit:
    state: str  # "done" | "failed" | "stopped"
    returncode: int | None
    reason: str
    # For a failure: "script" (the trainer's own code), "restarts" (its restart budget
    # spent) or "infrastructure" (what ran it), see channel.EXIT_CAUSES.
    cause: str | None = None


def stop_grace_s(text: str | None = None) -> float:
    """The grace ``text`` gives (``stop.grace``'s), else BFTRAINER_STOP_GRACE_S's, else
    the default: a value that is not a number in [0, MAX_STOP_GRACE_S] is passed over
    (an endless grace would keep a stopped trainer's processes for ever)."""
    for given in (text, os.environ.get("BFTRAINER_STOP_GRACE_S")):
        try:
            value = float(given) if given is not None else math.nan
        except ValueError:
            continue
        if 0.0 <= value <= MAX_STOP_GRACE_S:
            return value
    return DEFAULT_STOP_GRACE_S


class Launcher:
    """A trainer's detached supervisor, seen from its driver."""

    def __init__(self, trainer_dir: Path, pid: int, proc: subprocess.Popen[bytes] | None = None):
        self.trainer_dir = Path(trainer_dir)
        self.pid = pid
        self._proc = proc  # set when started here: poll() reaps it

    @classmethod
    def start(
        cls,
        spec: LaunchSpec,
        hosts: Sequence[str | tuple[str, int]],
        *,
        tied_grace_s: float | None = None,
    ) -> Launcher:
        """Write the spec and hosts, spawn the supervisor (its own session).

        ``tied_grace_s`` (``bftrainer run``): the supervisor gets SIGTERM when this
        process dies, however it dies, and gives its workers that long to checkpoint
        before it ends them. The daemon's supervisors outlive the daemon instead."""
        spec.check()
        d = Path(spec.trainer_dir).resolve()
        d.mkdir(parents=True, exist_ok=True)
        for stale in (channel.EXIT, channel.STOP_REQUEST, "failure.json", STOP_GRACE):
            (d / stale).unlink(missing_ok=True)
        spec = LaunchSpec(**{**asdict(spec), "trainer_dir": d, "script": spec.script.resolve()})
        channel.write_text_atomic(d / channel.SPEC, spec.to_json())
        channel.write_hosts(d, list(hosts))
        if tied_grace_s is not None:
            channel.write_text_atomic(d / STOP_GRACE, f"{tied_grace_s}\n")
        with open(d / channel.SUPERVISOR_LOG, "ab") as log:
            proc = subprocess.Popen(
                [spec.python, "-m", SUPERVISOR_MODULE, str(d)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **spec.env},
                cwd=d,
                preexec_fn=None if tied_grace_s is None else lifeline.tied_to_this_process(),
            )
        channel.write_text_atomic(d / channel.SUPERVISOR_PID, f"{proc.pid}\n")
        logger.debug("trainer %s: supervisor %d in %s", spec.trainer_id, proc.pid, d)
        return cls(d, proc.pid, proc)

    @classmethod
    def attach(cls, trainer_dir: Path) -> Launcher:
        path = Path(trainer_dir) / channel.SUPERVISOR_PID
        try:
            # A FIFO or a device in its place is refused, never waited on or read
            # without end; a pid is a few digits.
            with open_regular(path) as f:
                pid = int(f.read(32).strip())
        except (OSError, ValueError) as e:
            raise LaunchError(f"{path}: no supervisor pid ({e})") from None
        if pid < 1:
            raise LaunchError(f"{path}: no supervisor pid ({pid} is not a process)")
        return cls(Path(trainer_dir), pid)

    @classmethod
    def running_in(cls, trainer_dir: Path) -> Launcher | None:
        """The supervisor of ``trainer_dir`` if one runs on this machine now: its pid file
        names a live process that is that directory's supervisor (a recycled pid is not
        taken for it). How a restarted daemon redoes a start without a second one."""
        try:
            launcher = cls.attach(trainer_dir)
        except LaunchError:
            return None
        return launcher if launcher.alive() else None

    def _is_supervisor(self) -> bool:
        """Whether ``pid`` is this directory's supervisor now, by its command line (a
        pid the kernel has given to another process since is not)."""
        try:
            argv = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        mine = os.fsencode(str(self.trainer_dir.resolve()))
        return SUPERVISOR_MODULE.encode() in argv and mine in argv

    def set_hosts(self, hosts: Sequence[str | tuple[str, int]]) -> None:
        """``host`` or ``(host, slots)`` each; [] is zero hosts."""
        channel.write_hosts(self.trainer_dir, list(hosts))

    def set_exec(
        self, mode: str, slurm_jobs: Mapping[str, str], ssh_args: Sequence[str] = ()
    ) -> None:
        channel.write_exec(self.trainer_dir, mode, slurm_jobs, ssh_args)

    def alive(self) -> bool:
        """The supervisor runs: started here, by its process; attached, by identity
        (its pid alive, not a zombie, and still this directory's supervisor)."""
        if self._proc is not None:
            return self._proc.poll() is None
        return remote.alive(self.pid) and self._is_supervisor()

    def stop(self, grace_s: float = 30.0) -> None:
        """Ask the supervisor to stop (workers checkpoint); wait for it, then kill."""
        channel.write_text_atomic(self.trainer_dir / STOP_GRACE, f"{grace_s}\n")
        if not self.alive():
            return  # never a signal to a pid that is no longer our supervisor's
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s + 15.0
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.alive():
            logger.warning("supervisor %d did not stop in %.0f s: killing it", self.pid, grace_s)
            self.kill()

    def poll(self) -> TrainerExit | None:
        """None while the supervisor lives; else how the trainer ended (exit.json)."""
        if self.alive():
            return None
        data: Any = None
        try:
            data = channel.read_exit(self.trainer_dir)
        except channel.ChannelError as e:
            return TrainerExit("failed", None, str(e), "infrastructure")
        if data is None:
            return TrainerExit(
                "failed",
                None,
                f"its supervisor (pid {self.pid}) ended without saying why (killed?)",
                "infrastructure",
            )
        return TrainerExit(
            str(data["state"]),
            data.get("returncode"),
            str(data.get("reason", "")),
            data.get("cause"),
        )

    def wait(self, timeout_s: float | None = None) -> TrainerExit | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while deadline is None or time.monotonic() < deadline:
            result = self.poll()
            if result is not None:
                return result
            time.sleep(0.2)
        return None

    def kill(self) -> None:
        """SIGKILL the supervisor, its process group and every process it started,
        and any process left here by an earlier supervisor of the same trainer."""
        if self._proc is not None or self._is_supervisor():  # never a recycled pid's tree
            remote.kill_tree(self.pid, signal.SIGKILL)
        for pid in remote.processes_of(self.trainer_dir):
            remote.kill_tree(pid, signal.SIGKILL)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
