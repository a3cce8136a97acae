"""One process tree: a child that ends when its parent ends, however the parent ends.

A process group ends with a signal sent to the group, but not when its leader is killed
with SIGKILL: the children are adopted by init and go on (a replay's workers printed
BrokenPipeError tracebacks; a ``bftrainer run`` killed left its supervisor and torchrun
training with nobody watching). Linux's ``PR_SET_PDEATHSIG`` has the kernel signal the
child when its parent dies, by any signal. And SIGTERM, what batch systems, ``timeout``
and systemd send, raises :class:`Terminated` where Ctrl-C raises KeyboardInterrupt
(``bftrainer.cli.main``): the command stops cleanly.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: handled wherever Ctrl-C is (``signum`` says which)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def die_with_parent(sig: int = signal.SIGTERM, parent_pid: int | None = None) -> None:
    """In a child: receive ``sig`` when the parent dies. ``parent_pid``: the parent it was
    started by; if that one is already gone (it died before this call), act at once."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return  # not fatal: the process group and explicit stops still reach it
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def tied_to_this_process(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when this
    process dies. Only from the main thread: the kernel ties it to the creating thread."""
    parent = os.getpid()
    return lambda: die_with_parent(sig, parent)
