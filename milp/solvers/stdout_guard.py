"""Keep solver libraries off the process's stdout, which carries the commands' output.

Solvers print from native code, below Python's ``sys.stdout``: highspy 1.16 prints its
two-line banner when the first ``Highs()`` is built, before any option can silence it,
and a future release may print more. So while a solver runs, file descriptor 1 itself
points at a temporary file, and what landed there goes to the log at debug level. This
holds for every backend and every version, and for a child process (CBC) too.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

log = logging.getLogger(__name__)

# File descriptor 1 is one per process: two solves at once must not swap it twice.
_lock = threading.Lock()


def _flush_c_stdio() -> None:
    """Flush C's stdout buffer: into a pipe it holds what a solver printed until exit."""
    with suppress(OSError, AttributeError):  # no C library to ask (not a POSIX build)
        ctypes.CDLL(None).fflush(None)


@contextmanager
def solver_stdout_to_log() -> Iterator[None]:
    """Run the body with fd 1 sent to a temporary file, logged at debug level after."""
    with _lock, tempfile.TemporaryFile() as sink:
        if sys.stdout is not None:
            sys.stdout.flush()  # our own text written before the solve stays on stdout
        _flush_c_stdio()
        try:
            saved = os.dup(1)
        except OSError:  # no stdout at all: nothing to protect
            yield
            return
        try:
            os.dup2(sink.fileno(), 1)
            yield
        finally:
            _flush_c_stdio()
            os.dup2(saved, 1)
            os.close(saved)
        sink.seek(0)
        text = sink.read().decode(errors="replace").strip()
        if text:
            log.debug("solver output: %s", text)
