"""torchrun's agent (``torch.distributed.run``): resident on a host across generations,
ending at once when its node is taken.

    python -m bftrainer.trainers.launch.torchrun_agent --resident
    python -m bftrainer.trainers.launch.torchrun_agent [torchrun's arguments]

Every membership change starts a new torchrun generation on every host (supervisor.py
says why). A torchrun agent imports torch, and what every worker imports next (an
optimizer imports ``torch._dynamo``; the runtime), about 3 s of CPU here and more from a
shared file system: paid again on every host at every rescale, that was a third of the
test suite's CPU. So the supervisor keeps one *resident* per host: it imports all that
once, then forks one torchrun agent per generation, which forks its workers
(``--run-path --start-method=fork``), and so on. Nothing here initialises CUDA or a
process group, so each generation starts both afresh.

The resident's protocol, one JSON object a line: on standard input ``{"start": N,
"args": [...]}`` (torchrun's arguments) or ``{"signal": S}`` (to the running agent:
15 asks it to stop its workers, 9 ends its tree); on standard output ``{"ready":
true}`` once its imports are done (the supervisor holds a start until then), and
``{"generation": N, "exit": code}`` when that agent has ended (a negative code: the
signal that ended it). Everything the agents and workers print goes to standard error.
When its input ends (the supervisor is gone) or it gets SIGTERM, the resident stops the
running agent and exits once that one has.

With arguments, this runs one torchrun agent in this process, as a generation does. On
SIGTERM (a Slurm preemption signals every process of the step) torchrun's agent stops
its workers, then leaves through the interpreter's teardown: 0.86 s more, measured on
these machines, during which the main job that preempted the node cannot start. Both
the agent and the resident exit as soon as the workers are gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import traceback
from types import FrameType
from typing import NoReturn

import torch._dynamo  # noqa: F401  (for the workers: see the docstring)
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main as torchrun_main

import bftrainer.trainers.runtime  # noqa: F401  (for the workers)
from bftrainer.common import strict_json
from bftrainer.trainers import lifeline
from bftrainer.trainers.launch import remote
from bftrainer.trainers.launch.worker import name_process

TERMINATED = 143  # 128 + SIGTERM, as torchrun's own exit on a signal
STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _exit(code: int) -> NoReturn:
    """Exit now: torch's teardown costs a preempting main job the best part of a second."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_agent(args: list[str]) -> int:
    """One torchrun agent with ``args``, in this process; its exit code. A second
    SIGTERM (Slurm signals every process of a step, and the resident passes its own on)
    does not cut its stop short: torchrun's agent then shuts its workers down again,
    waiting for them (tests/trainers/test_elastic_torchrun.py guards it)."""
    try:
        torchrun_main(args)
    except SignalException:
        return TERMINATED
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()  # a worker failed (ChildFailedError), as torchrun prints it
        return 1
    return 0


class Resident:
    """The loop of ``--resident``: one generation's agent at a time, forked."""

    def __init__(self) -> None:
        self.reports = os.dup(1)
        os.dup2(2, 1)  # prints of agents and workers to the log, not to the reports
        self.pending = b""
        self.input_open = True
        self.stopping = False
        self.agent: int | None = None  # the running generation's agent
        self.agent_fd: int | None = None  # its pidfd: readable once it has ended
        self.generation = 0
        self._report({"ready": True})  # torch imported: a start now costs a fork

    def _report(self, report: dict[str, object]) -> None:
        os.write(self.reports, (strict_json.dumps(report) + "\n").encode())

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        if self.agent is None:
            _exit(TERMINATED)
        self.stopping = True  # leave once the agent has (its pidfd wakes the loop)
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self.agent is None:
            return
        if sig == signal.SIGKILL:
            remote.kill_tree(self.agent, signal.SIGKILL)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.agent, sig)

    def _start(self, generation: int, args: list[str]) -> None:
        if self.agent is not None:
            print(f"resident: generation {generation} asked while one runs", file=sys.stderr)
            return
        resident = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(self.reports)
                for sig in STOPS:
                    signal.signal(sig, signal.SIG_DFL)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                lifeline.die_with_parent(signal.SIGTERM, resident)
                name_process(f"torchrun-g{generation}")
                code = run_agent(args)
            except BaseException:
                traceback.print_exc()
            finally:
                _exit(code)
        self.agent, self.generation = pid, generation
        self.agent_fd = os.pidfd_open(pid)

    def _ended(self) -> None:
        assert self.agent is not None and self.agent_fd is not None
        _, status = os.waitpid(self.agent, 0)
        os.close(self.agent_fd)
        self.agent = self.agent_fd = None
        self._report({"generation": self.generation, "exit": os.waitstatus_to_exitcode(status)})

    def _read_input(self) -> None:
        chunk = os.read(0, 65536)
        if not chunk:
            self.input_open = False  # the supervisor is gone: stop the agent, then leave
            self._signal(signal.SIGTERM)
            return
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
                if "start" in message:
                    self._start(int(message["start"]), [str(a) for a in message["args"]])
                elif "signal" in message:
                    self._signal(int(message["signal"]))
            except (ValueError, KeyError, TypeError) as e:
                print(f"resident: bad message {line[:200]!r}: {e}", file=sys.stderr)

    def run(self) -> NoReturn:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_stop)
        while self.agent is not None or (self.input_open and not self.stopping):
            watched = [fd for fd in (self.agent_fd,) if fd is not None]
            if self.input_open:
                watched.append(0)
            readable, _, _ = select.select(watched, [], [])
            if self.agent_fd is not None and self.agent_fd in readable:
                self._ended()
            if 0 in readable:
                self._read_input()
        _exit(TERMINATED if self.stopping else 0)


def main(argv: list[str]) -> NoReturn:
    if argv == ["--resident"]:
        Resident().run()
    _exit(run_agent(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
