"""A command started over ssh ends with the ssh client that started it (real sshd).

sshd signals nothing to a command without a terminal when its client goes away; the
tether on the remote side ends the command when its standard input does, so killing a
supervisor's process tree also ends what it started on other hosts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from bftrainer.trainers.launch import remote
from tests.conftest import SshServer, wait_until


def _pids_with(marker: str) -> list[int]:
    """Live python processes whose command line ends with ``marker`` (not the tether's
    or the ssh client's, whose command lines carry it too)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        cmd = [c for c in cmd if c]
        if (
            cmd
            and cmd[-1] == marker
            and "python" in Path(cmd[0]).name
            and "bftrainer.trainers.launch.tether" not in cmd
            and remote.alive(int(entry.name))
        ):
            found.append(int(entry.name))
    return found


def _sleeper(marker: str) -> list[str]:
    return [sys.executable, "-c", "import sys, time; time.sleep(300)", marker]


def test_the_tether_ends_its_command_when_its_input_ends() -> None:
    marker = f"tether-{uuid.uuid4().hex}"
    tether = subprocess.Popen(
        [sys.executable, "-m", "bftrainer.trainers.launch.tether", "--", *_sleeper(marker)],
        stdin=subprocess.PIPE,
    )
    try:
        wait_until(lambda: bool(_pids_with(marker)), 30, "the tethered command")
        assert tether.poll() is None
        assert tether.stdin is not None
        tether.stdin.close()  # what the remote side sees when the connection ends
        assert tether.wait(timeout=30) == 128 + signal.SIGTERM
        wait_until(lambda: not _pids_with(marker), 15, "the command gone")
    finally:
        for pid in [tether.pid, *_pids_with(marker)]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        tether.wait(timeout=10)


@pytest.mark.sshd
def test_a_command_over_ssh_ends_when_its_ssh_client_is_killed(
    sshd: SshServer, tmp_path: Path
) -> None:
    marker = f"remote-{uuid.uuid4().hex}"
    config = {
        "mode": "ssh",
        "ssh_args": [
            "-p", str(sshd.port), "-i", str(sshd.key), "-l", sshd.user,
            "-o", f"HostName={sshd.host}", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={sshd.known_hosts}",
            "-o", f"HostKeyAlias=[{sshd.host}]:{sshd.port}",
        ],
    }  # fmt: skip
    argv = remote.wrap_command("127.0.0.2", _sleeper(marker), config, cwd=str(tmp_path))
    client = subprocess.Popen(argv, stdin=subprocess.PIPE, start_new_session=True)
    try:
        wait_until(lambda: bool(_pids_with(marker)), 30, "the command started over ssh")
        [started] = _pids_with(marker)
        assert started not in remote.descendants(client.pid)  # sshd's child, not ours
        os.killpg(client.pid, signal.SIGKILL)  # what Launcher.kill does to the tree
        client.wait(timeout=10)
        wait_until(lambda: not remote.alive(started), 20, "the remote command gone")
    finally:
        with contextlib.suppress(OSError):
            os.killpg(client.pid, signal.SIGKILL)
        for pid in _pids_with(marker):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        client.wait(timeout=10)
