"""The runs of a sweep as the tasks of one Slurm job array, through submitit.

A centre evaluating a year of logs runs many replays; the cluster it already has is the
engine to spread them over. submitit (the established library) writes the array's
sbatch script, pickles each task's call and reads its result back; this module chooses
the options, waits, and turns each task's end into its result or a named failure.
Import it only when asked for: submitit is an optional extra (``bftrainer[slurm]``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import pickle
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError
from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob
from tqdm import tqdm

log = logging.getLogger(__name__)

C = TypeVar("C")
R = TypeVar("R")

# The tasks' states are asked of Slurm at most this often (one squeue for all).
POLL_S = 5
# The state of a task squeue no longer lists: cancelled while pending (Slurm drops it at
# once), or ended longer than MinJobAge ago.
GONE = "GONE"
GONE_WHY = "ended over MinJobAge ago"


class SlurmSweepError(RuntimeError):
    """The array could not be submitted (no Slurm client, or sbatch refused it)."""


@dataclass(frozen=True)
class SlurmOptions:
    """Where and how the array runs. ``folder`` holds the shared inputs and each task's
    call, result and log: the nodes must see it (a shared filesystem)."""

    folder: Path
    partition: str | None = None
    account: str | None = None
    time_min: int = 60
    job_name: str = "bftrainer-replay"
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskFailure:
    """A task that ended without a result: why, in one line, and where its log is."""

    index: int
    reason: str
    log: Path


class SqueueWatcher(SlurmInfoWatcher):
    """Task states from squeue, not sacct as submitit's own: sacct needs the accounting
    database, which a cluster may not run (the local test cluster does not). squeue
    keeps an ended task for MinJobAge (300 s by default); a task it no longer lists has
    ended too (``GONE``), with or without a result."""

    def _make_command(self) -> list[str] | None:
        if not self._registered - self._finished:
            return None
        return ["squeue", "--me", "-h", "-r", "-t", "all", "-o", "%i|%T|%N"]

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        text = string.decode() if isinstance(string, bytes) else string
        info = {}
        for line in text.splitlines():
            job_id, _, rest = line.strip().partition("|")
            state, _, nodes = rest.partition("|")
            if job_id:
                info[job_id] = {"JobID": job_id, "State": state, "NodeList": nodes}
        for job_id in self._registered - self._finished - info.keys():
            info[job_id] = {"JobID": job_id, "State": "GONE", "NodeList": ""}
        return info


class _SweepJob(SlurmJob[Any]):
    watcher = SqueueWatcher(delay_s=POLL_S)


def run_array(
    fn: Callable[[Any, C], R],
    inputs: Any,
    configs: Sequence[C],
    options: SlurmOptions,
    progress: bool = False,
) -> list[R | TaskFailure]:
    """``fn(inputs, config)`` for each config, each a task of one job array: the results
    in the configs' order, a :class:`TaskFailure` where a task ended without one.

    ``fn`` must be importable by name (a module-level function): the tasks run it in a
    new interpreter, this same ``python``, on the nodes. ``inputs`` go to the folder
    once, not into each task's call (a week's trace, twelve times over). Ctrl-C cancels
    the array.
    """
    if shutil.which("sbatch") is None:
        raise SlurmSweepError("sbatch is not on PATH: --executor slurm needs a Slurm client")
    options.folder.mkdir(parents=True, exist_ok=True)
    inputs_path = (options.folder / f"inputs-{uuid.uuid4().hex}.pickle").resolve()
    inputs_path.write_bytes(pickle.dumps(inputs))
    try:
        executor = submitit.SlurmExecutor(folder=options.folder / "%j", max_num_timeout=0)
        params: dict[str, Any] = {"time": options.time_min, "job_name": options.job_name}
        if options.partition:
            params["partition"] = options.partition
        if options.account:
            params["account"] = options.account
        # Held until submitit has made every task's folder (it makes them once sbatch
        # has answered): a task Slurm started before had nowhere to write its log and
        # died at once (seen on a loaded machine: signal 53, "Could not open stdout").
        params["additional_parameters"] = {**options.extra, "hold": True}
        executor.update_parameters(**params)
        n = len(configs)
        try:
            # submitit prints sbatch's whole stderr (a configless client's DNS lookups,
            # a dozen lines) before it raises: kept here, and said in one line below.
            with contextlib.redirect_stderr(io.StringIO()):
                submitted = executor.map_array(_task, [fn] * n, [inputs_path] * n, list(configs))
        except Exception as exc:  # submitit's own errors and sbatch's exit status
            raise SlurmSweepError(f"sbatch refused the array: {_sbatch_failure(exc)}") from None
        # submitit 1.5.4 makes an array's tasks plain SlurmJobs whatever its job_class
        # says: the same tasks, as jobs whose watcher asks squeue.
        jobs = [
            _SweepJob(folder=executor.folder, job_id=j.job_id, tasks=list(range(j.num_tasks)))
            for j in submitted
        ]
        log.info("submitted %d replays as Slurm job array %s", n, _array_id(jobs))
        try:
            _release(_array_id(jobs))
            _wait(jobs, progress)
        except BaseException:
            subprocess.run(["scancel", _array_id(jobs)], check=False, capture_output=True)
            raise
        return [_outcome(i, job) for i, job in enumerate(jobs)]
    finally:
        inputs_path.unlink(missing_ok=True)


def _task(fn: Callable[[Any, C], R], inputs_path: Path, config: C) -> R:
    """What one task runs, on its node."""
    return fn(pickle.loads(inputs_path.read_bytes()), config)


def _wait(jobs: Sequence[Any], progress: bool) -> None:
    left = set(range(len(jobs)))
    with tqdm(total=len(jobs), desc="replays", unit="run", disable=not progress or None) as bar:
        while left:
            finished = {i for i in left if jobs[i].done()}
            bar.update(len(finished))
            left -= finished
            if left:
                time.sleep(1.0)


def _outcome(index: int, job: Any) -> Any:
    try:
        return job.result()
    except (FailedJobError, UncompletedJobError) as exc:
        lines = str(exc).strip().splitlines()
        if job.paths.result_pickle.exists() and lines:  # it ran and raised: the error
            reason = _one_line(lines[-1])
        elif job.state == GONE:
            reason = f"ended without a result (no longer in squeue: cancelled, or {GONE_WHY})"
        else:
            reason = f"ended {job.state} without a result"
        return TaskFailure(index, reason, job.paths.stderr)


def _release(array_id: str) -> None:
    """Let the held array run (its tasks' folders are made)."""
    done = subprocess.run(["scontrol", "release", array_id], capture_output=True, text=True)
    if done.returncode:
        said = _one_line(done.stderr.strip() or f"exit status {done.returncode}")
        raise SlurmSweepError(f"scontrol release {array_id} failed: {said}")


def _array_id(jobs: Sequence[Any]) -> str:
    return str(jobs[0].job_id).split("_")[0]


def _sbatch_failure(exc: Exception) -> str:
    """The command that failed and Slurm's telling line (its ``fatal:`` one, else its
    last), from submitit's error over sbatch's exit status; else the error in one line."""
    cause = exc.__cause__
    if not isinstance(cause, subprocess.CalledProcessError):
        return _one_line(str(exc))
    argv = cause.cmd if isinstance(cause.cmd, list | tuple) else [cause.cmd]
    command = " ".join(str(a) for a in argv)
    stderr = (
        cause.stderr.decode(errors="replace") if isinstance(cause.stderr, bytes) else cause.stderr
    )
    lines = [line.strip() for line in str(stderr or "").splitlines() if line.strip()]
    fatal = [line for line in lines if "fatal" in line.lower()]
    telling = (fatal or lines or [""])[-1]
    said = f": {_one_line(telling)}" if telling else ""
    return f"`{command}` exited with status {cause.returncode}{said}"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]
