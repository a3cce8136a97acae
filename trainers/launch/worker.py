"""Runs the user's trainer.py in a worker and turns a user error into ``failure.json``.

``python -m bftrainer.trainers.launch.worker SCRIPT [ARGS]`` runs SCRIPT as
``__main__`` (torchrun's agent runs this file in the workers it forks). When trainers
share nodes it first gives itself its slot's CPUs and GPUs
(:mod:`~bftrainer.trainers.launch.slot_pin`), before the script runs, and says so in one
line. An exception from the script (at import, from its options, at step N)
is printed with its traceback (to the supervisor's log) and its last line is written to
``TRAINER_DIR/failure.json``, so the supervisor fails the trainer at once rather than
letting the backend restart a script that will fail again. A lost peer
(:class:`~bftrainer.trainers.comm.CommLostError`) is the backend's business: no
failure file, the backend restarts or resets the workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import runpy
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

from bftrainer.trainers import channel
from bftrainer.trainers.comm import WorkerLeaving
from bftrainer.trainers.launch import slot_pin

FAILURE = "failure.json"
LEFT_EXIT_CODE = 143  # 128 + SIGTERM: a worker that left on preemption
PROCESS_NAME = "bftrainer-w"  # then the rank: what ps shows as the worker's name (comm)
PR_SET_NAME = 15  # prctl(2)


def _rank() -> str:
    for name in ("HOROVOD_RANK", "RANK"):
        if name in os.environ:
            return os.environ[name]
    return "0"


def record_failure(reason: str) -> None:
    trainer_dir = os.environ.get("BFTRAINER_TRAINER_DIR")
    if not trainer_dir or not Path(trainer_dir).is_dir():
        return
    path = Path(trainer_dir) / FAILURE
    if path.exists():
        return  # the first failure is the one to report
    channel.write_json_atomic(
        path,
        {"reason": reason, "rank": _rank(), "host": socket.gethostname(), "time_s": time.time()},
    )


def leave_now() -> NoReturn:
    """Exit with :data:`LEFT_EXIT_CODE` now, skipping the interpreter's teardown (the
    worker has committed; nothing is left to save)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(LEFT_EXIT_CODE)


def _is_peer_loss(exc: BaseException) -> bool:
    from bftrainer.trainers.comm import CommLostError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, CommLostError):
            return True
        name = type(seen).__name__
        if name in ("HorovodInternalError", "HostsUpdatedInterrupt"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def pin_to_slot() -> None:
    """Run on this worker's slot of a shared node (nothing when nodes are not shared);
    one line on stderr (the supervisor's log) says which, or why it could not."""
    trainer_dir = os.environ.get("BFTRAINER_TRAINER_DIR")
    if not trainer_dir:
        return
    try:
        pinned = slot_pin.pin(Path(trainer_dir), os.environ)
    except (ValueError, OSError) as e:
        print(f"bftrainer: running on the whole node, its slot unknown: {e}", file=sys.stderr)
        return
    if pinned is not None:
        print(f"bftrainer: {pinned.describe()}", file=sys.stderr)


def _slot_removed() -> bool:
    """Under Horovod, whether this worker's host, or its local rank there, is gone from
    the job's hosts (the supervisor's discovery copy). Its reset then fails ("has been
    removed from elastic job": seen as an abort, exit 134, which Horovod ignores; as
    ``hvd.init``'s ValueError it would reach here): a shrink, not the script's error."""
    trainer_dir = os.environ.get("BFTRAINER_TRAINER_DIR")
    host = os.environ.get("HOROVOD_HOSTNAME")
    rank = os.environ.get("HOROVOD_LOCAL_RANK")
    if not (trainer_dir and host and rank and rank.isdigit()):
        return False
    path = Path(trainer_dir) / channel.DISCOVERY_HOSTS
    try:
        hosts = dict(channel.parse_hosts(path.read_text(), str(path)))
    except (OSError, channel.ChannelError):
        return False
    return int(rank) >= hosts.get(host, 0)


def _default_signals() -> None:
    """Drop the handlers a worker forked from torchrun's agent inherits from it (they
    raise ``SignalException``: a SIGTERM before the runtime sets its own handler would
    read as the script's error, not as a preemption). A worker started afresh keeps
    what it was started with (a disposition its launcher chose, SIG_IGN included)."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGINT):
        handler = signal.getsignal(sig)
        if callable(handler) and handler is not signal.default_int_handler:
            default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
            signal.signal(sig, default)


def name_process(name: str) -> None:
    """What ``ps -o comm`` and ``top`` show for this process (15 bytes: the kernel's)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(
            PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0
        )


def _name_process() -> None:
    """Name this process ``bftrainer-w<rank>`` (its rank at start): a worker forked by
    torchrun's agent has the agent's command line."""
    name_process(f"{PROCESS_NAME}{_rank()}")


def main(argv: list[str]) -> int:
    _default_signals()
    _name_process()
    if not argv:
        print("usage: python -m bftrainer.trainers.launch.worker SCRIPT [ARGS]", file=sys.stderr)
        return 2
    script = argv[0]
    if not Path(script).is_file():
        reason = f"trainer script not found: {script}"
        print(f"bftrainer: {reason}", file=sys.stderr)
        record_failure(reason)
        return 2
    pin_to_slot()
    sys.argv = list(argv)
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code != 0:
            record_failure(f"{Path(script).name} exited with code {code}")
        return code
    except KeyboardInterrupt:
        return 130
    except WorkerLeaving as e:
        # Preempted (SIGTERM): committed with the others and leaving alone. Non-zero, so
        # that Horovod counts this host as failed (a worker that exits 0 makes Horovod
        # end the whole job once the others finish), but not a user error. At once:
        # the interpreter's own teardown (torch's, gloo's) took 1.4 s more, measured,
        # and a main job waits for this process to be gone before it starts.
        print(f"bftrainer: {e}", file=sys.stderr)
        leave_now()
    except Exception as e:
        traceback.print_exc()
        sys.stderr.flush()
        if _is_peer_loss(e):
            return 1
        if _slot_removed():
            print("bftrainer: this worker's slot left the job: leaving", file=sys.stderr)
            return 1
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        record_failure(f"{Path(script).name}: {last}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
