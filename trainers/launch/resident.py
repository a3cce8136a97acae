"""The supervisor's side of torchrun's resident agents: one per host, kept across
generations (the resident itself, and why, in ``torchrun_agent.py``).

A resident is started as ``exec.json`` says for its host (here, over ssh, or as a step
of the host's Slurm holder) and kept while the host stays in the trainer's set and its
command stays the same (a new holder job on the host starts a new one). Each
generation asks the residents of its hosts to start one torchrun agent; a generation's
exit code per host is what its resident reports, or the resident's own when it ended
first (its node preempted, its holder gone).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from subprocess import Popen

from bftrainer.common import strict_json
from bftrainer.trainers.launch import remote

logger = logging.getLogger("bftrainer.supervisor")

Spawn = Callable[[list[str], Mapping[str, str]], "Popen[bytes]"]


class Resident:
    """One host's resident agent, as the supervisor sees it."""

    def __init__(self, host: str, command: Sequence[str], proc: Popen[bytes]) -> None:
        self.host = host
        self.command = tuple(command)
        self.proc = proc
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        self._pending = b""
        self.ready = False  # it has imported torch and reads its orders
        self._held: dict[str, object] | None = None  # a start asked before it was ready
        self.generation: int | None = None  # the generation asked of it last
        self._exits: dict[int, int] = {}  # generation -> its agent's exit code

    def _send(self, message: Mapping[str, object]) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):  # gone: poll says so
            self.proc.stdin.write((strict_json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()

    def start(self, generation: int, args: Sequence[str]) -> None:
        """Start a generation's agent: at once, or when it is ready."""
        self.generation = generation
        message = {"start": generation, "args": list(args)}
        if self.ready:
            self._send(message)
        else:
            self._held = message

    def signal(self, sig: int) -> None:
        """To the running agent. A start still held is dropped: that generation ended
        before it began (stopping it cost no wait for the resident's imports)."""
        if self._held is not None and self.generation is not None:
            self._held = None
            self._exits[self.generation] = -int(sig)
            return
        self._send({"signal": int(sig)})

    def _read_reports(self) -> None:
        assert self.proc.stdout is not None
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self.proc.stdout.fileno(), 65536):
                self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            try:
                report = json.loads(line)
                if report.get("ready"):
                    self.ready = True
                    if self._held is not None:
                        self._send(self._held)
                        self._held = None
                else:
                    self._exits[int(report["generation"])] = int(report["exit"])
            except (ValueError, KeyError, TypeError, AttributeError):
                logger.warning("%s: resident said %r", self.host, line[:200])

    def exit_code(self) -> int | None:
        """The exit code of the generation asked last: None while it runs."""
        self._read_reports()
        if self.generation in self._exits:
            return self._exits[self.generation]
        ended = self.proc.poll()
        if ended is not None:
            self._read_reports()  # what it said before it ended
            return self._exits.get(self.generation or 0, ended)
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """End it: its input ends, so it stops what runs and exits."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def kill(self) -> None:
        remote.kill_tree(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)


class Residents:
    """The residents of one trainer, by host; owned by its supervisor."""

    def __init__(self) -> None:
        self._by_host: dict[str, Resident] = {}

    def get(
        self, host: str, command: Sequence[str], env: Mapping[str, str], spawn: Spawn
    ) -> Resident:
        """The resident of ``host`` started with ``command``: the one running, or a new one."""
        current = self._by_host.get(host)
        if current is not None and current.command == tuple(command) and current.alive():
            return current
        if current is not None:
            self._end([current])
        resident = Resident(host, command, spawn(list(command), env))
        self._by_host[host] = resident
        return resident

    def keep_only(self, hosts: Sequence[str]) -> None:
        """End the residents of hosts no longer in the trainer's set."""
        self._end([r for h, r in self._by_host.items() if h not in hosts])

    def close(self) -> None:
        self._end(list(self._by_host.values()))

    def _end(self, residents: list[Resident]) -> None:
        for r in residents:
            self._by_host.pop(r.host, None)
            r.close()
        deadline = time.monotonic() + 10.0
        while any(r.alive() for r in residents) and time.monotonic() < deadline:
            time.sleep(0.05)
        for r in residents:
            if r.alive():
                logger.warning("%s: resident agent did not exit; killing it", r.host)
                r.kill()
            with contextlib.suppress(Exception):
                r.proc.wait(timeout=5)
