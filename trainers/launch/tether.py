"""Run a command on a host reached over ssh, and end it when the ssh connection ends.

sshd sends no signal to a command without a terminal when the client goes away: a
worker (or torchrun agent) started over ssh would outlive the supervisor that started
it, and ``Launcher.kill`` could not reach it. The client side keeps ssh's standard
input open for as long as ssh lives (see ``remote.wrap_command`` and the ssh shim), so
the remote standard input ends exactly when the connection does. This tether runs the
command in its own process group, passes its standard input on to the command until it
ends, then stops the group: SIGTERM (a worker commits with the others and leaves), and
SIGKILL after a grace period. SIGTERM, SIGINT or SIGHUP to the tether are passed to the
group the same way. It exits with the command's status.

    python -m bftrainer.trainers.launch.tether [--grace-s S] -- COMMAND [ARGS]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import FrameType

DEFAULT_GRACE_S = 10.0


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # what is left of the group after the grace


def run(command: Sequence[str], grace_s: float = DEFAULT_GRACE_S) -> int:
    proc = subprocess.Popen(list(command), stdin=subprocess.PIPE, start_new_session=True)
    to_command = proc.stdin
    assert to_command is not None
    stopping = threading.Event()

    def stop() -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=_stop_group, args=(proc, grace_s), daemon=True).start()

    def watch_stdin() -> None:
        # What comes in goes on to the command (a resident agent's orders). Its input
        # stays open after ours ends: the group is stopped by signal, once.
        with contextlib.suppress(OSError):
            while chunk := os.read(0, 65536):
                with contextlib.suppress(OSError):
                    to_command.write(chunk)
                    to_command.flush()
        stop()  # the connection is gone

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    threading.Thread(target=watch_stdin, daemon=True).start()
    returncode = proc.wait()
    if stopping.is_set():  # the group may hold more than the leader: stop it all
        _stop_group(proc, grace_s)
    return returncode if returncode >= 0 else 128 - returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grace-s", type=float, default=DEFAULT_GRACE_S)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    return run(command, args.grace_s)


if __name__ == "__main__":
    sys.exit(main())
