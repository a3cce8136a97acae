"""Running a command on a host as ``exec.json`` says, and process-tree helpers.

Modes (``exec.json``'s ``mode``): ``local`` runs everything here; ``ssh`` (the default)
runs on hosts other than this machine's names over ``ssh`` (with ``ssh_args``); ``slurm``
runs on a host with ``srun --jobid=<holder job> --overlap -N1 -n1 -w <host>``. Hosts
named ``localhost``, ``127.0.0.1`` or this machine's hostname always run here.

Horovod starts its remote workers itself with ``ssh [opts] host [opts] 'command'``
(``horovod/runner/util/remote.py``); :func:`ssh_shim_main` is the ``ssh`` first on
Horovod's PATH that maps those calls to the chosen mode.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bftrainer.trainers import channel

logger = logging.getLogger(__name__)

# ssh options that take a value (from ssh(1)); the first other word is the host.
_SSH_VALUE_OPTS = set("BbcDEeFIiJLlmOoPpRSWw")


class RemoteExecError(RuntimeError):
    """A host that cannot be reached in the configured mode (names host and mode)."""


def local_names() -> set[str]:
    """The names that mean this machine: localhost, 127.0.0.1 and its host name, whole
    and short."""
    names = {"localhost", "127.0.0.1", socket.gethostname()}
    names.add(socket.gethostname().split(".")[0])
    return names


def is_local(host: str) -> bool:
    return host in local_names()


def exec_config(trainer_dir: Path) -> dict[str, Any]:
    return channel.read_exec(trainer_dir) or {"mode": "ssh", "slurm_jobs": {}, "ssh_args": []}


def real_ssh(exclude_dir: Path | None = None) -> str:
    """The system's ssh, skipping our shim's directory on PATH."""
    dirs = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and (exclude_dir is None or Path(d).resolve() != exclude_dir.resolve())
    ]
    found = shutil.which("ssh", path=os.pathsep.join(dirs))
    if found is None:
        raise RemoteExecError("no ssh on PATH")
    return found


def wrap_command(
    host: str,
    argv: Sequence[str],
    config: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    ssh: str = "ssh",
) -> list[str]:
    """The argv that runs ``argv`` on ``host`` (``env`` exported, in ``cwd``)."""
    env = dict(env or {})
    mode = config.get("mode", "ssh")
    if mode == "local" or is_local(host):
        return list(argv)
    if mode == "slurm":
        job = config.get("slurm_jobs", {}).get(host)
        if job is None:
            raise RemoteExecError(f"host {host!r}: exec.json mode slurm has no holder job for it")
        exports = ["--export=ALL"] if not env else [f"--export=ALL,{','.join(env)}"]
        return ["srun", f"--jobid={job}", "--overlap", "-N1", "-n1", "-w", host, *exports, *argv]
    if mode == "ssh":
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        tethered = shlex.join([*TETHER, *argv])
        remote = f"cd {shlex.quote(cwd or os.getcwd())} && exec env {assigns} {tethered}"
        return [ssh, *config.get("ssh_args", []), host, remote]
    raise RemoteExecError(f"host {host!r}: unknown exec mode {mode!r}")


def address_of(host: str, config: Mapping[str, Any]) -> str:
    """The address other hosts reach ``host`` at (torchrun's rendezvous endpoint).

    A Slurm node name need not resolve (the local test cluster's do not; some sites'
    do not either): in ``slurm`` mode it is the node's ``NodeAddr``.
    """
    if is_local(host) or config.get("mode") == "local":
        return "127.0.0.1"
    if config.get("mode") == "slurm":
        try:
            out = subprocess.run(
                ["scontrol", "show", "node", "-o", host],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError) as e:
            logger.warning("cannot read NodeAddr of %s (%s): using its name", host, e)
            return host
        for word in out.split():
            if word.startswith("NodeAddr="):
                return word.split("=", 1)[1] or host
    return host


def parse_ssh_argv(argv: Sequence[str]) -> tuple[list[str], str, str]:
    """Split an ssh command line into (options, host, remote command)."""
    opts: list[str] = []
    i = 0
    host = None
    rest: list[str] = []
    while i < len(argv):
        a = argv[i]
        if host is None and a.startswith("-") and len(a) > 1:
            opts.append(a)
            if a[1] in _SSH_VALUE_OPTS and len(a) == 2 and i + 1 < len(argv):
                opts.append(argv[i + 1])
                i += 1
        elif host is None:
            host = a
        elif a.startswith("-") and not rest and len(a) == 2 and a[1] in _SSH_VALUE_OPTS:
            opts.extend(argv[i : i + 2])  # Horovod puts -p/-i/-o after the host
            i += 1
        else:
            rest = list(argv[i:])
            break
        i += 1
    if host is None:
        raise RemoteExecError(f"ssh shim: no host in {list(argv)!r}")
    return opts, host, " ".join(rest)


# The remote side of an ssh command: ends the command when the connection ends.
TETHER = (sys.executable, "-m", "bftrainer.trainers.launch.tether", "--")


def run_holding_stdin(argv: Sequence[str]) -> int:
    """Run ``argv`` (an ssh) with a standard input this process holds open, passing
    it the signals this process gets; its exit status.

    ssh closes every descriptor above 2 when it starts, so it cannot hold the write
    end itself: this process does, and ssh forwards an end of input (which ends the
    remote tether) only when it is gone. Horovod gives ssh /dev/null otherwise.
    """
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE)

    def forward(signum: int, frame: Any) -> None:
        with contextlib.suppress(OSError):
            proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    returncode = proc.wait()
    return returncode if returncode >= 0 else 128 - returncode


def ssh_shim_main(argv: Sequence[str], trainer_dir: Path, shim_dir: Path) -> int:
    """Run Horovod's ``ssh host 'command'`` as ``exec.json`` says: execs the local or
    srun command; waits for an ssh (see :func:`run_holding_stdin`)."""
    opts, host, command = parse_ssh_argv(argv)
    config = exec_config(trainer_dir)
    mode = config.get("mode", "ssh")
    if mode == "local" or is_local(host):
        target = ["bash", "-c", command]
    elif mode == "slurm":
        job = config.get("slurm_jobs", {}).get(host)
        if job is None:
            print(f"bftrainer ssh shim: no holder job for {host} in exec.json", file=sys.stderr)
            return 255
        target = ["srun", f"--jobid={job}", "--overlap", "-N1", "-n1", "-w", host]
        target += ["bash", "-c", command]
    else:
        tethered = shlex.join([*TETHER, "bash", "-c", command])
        target = [real_ssh(shim_dir), *opts, *config.get("ssh_args", []), host, tethered]
        mode = "ssh"
    print(
        f"bftrainer ssh shim: {host} via {mode if not is_local(host) else 'local'}", file=sys.stderr
    )
    sys.stderr.flush()
    if mode == "ssh":
        return run_holding_stdin(target)
    os.execvp(target[0], target)
    return 255  # not reached


# -- process trees ---------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (Linux /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def processes_of(trainer_dir: Path) -> list[int]:
    """PIDs on this machine whose environment names ``trainer_dir`` as their trainer
    directory (a dead supervisor's workers, reparented away from it)."""
    marker = f"BFTRAINER_TRAINER_DIR={Path(trainer_dir).resolve()}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in env and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal ``pid``, its process group and every descendant (and their groups)."""
    pids = [pid, *descendants(pid)]
    groups = set()
    for p in pids:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(p))
    for g in groups:
        if g > 1 and g != os.getpgrp():
            with contextlib.suppress(OSError):
                os.killpg(g, sig)
    for p in pids:
        with contextlib.suppress(OSError):
            os.kill(p, sig)


def wait_gone(pids: Sequence[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return not any(alive(p) for p in pids)
