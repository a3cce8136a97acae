"""Where the runs of one ``bftrainer replay`` command go: here, one after another or in
a pool of processes, or to the tasks of one Slurm job array.

Every run of a command shares its inputs (the trace, the jobs, the Pollux driver's
factory): each worker reads them once, and a task holds only its configuration. A
worker dies with the replay that started it. Errors that stop every run raise
:class:`~bftrainer.replay.run.ReplayError`; a Slurm task that failed is reported with
its log, and the others' results are kept.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
import pickle
import signal
import tempfile
from multiprocessing import resource_tracker
from pathlib import Path

from tqdm import tqdm

from bftrainer.idle_monitor.trace import Trace
from bftrainer.loop.jobs import JobSpec
from bftrainer.replay.pollux.sim import PolluxDriverFactory, PolluxReport
from bftrainer.replay.run import ReplayConfig, ReplayError, ReplayResult, replay
from bftrainer.trainers import lifeline

Run = tuple[ReplayResult, PolluxReport | None]


def _run_one(
    args: tuple[Trace, list[JobSpec], ReplayConfig, PolluxDriverFactory | None],
) -> Run:
    trace, jobs, config, factory = args
    if factory is None:
        return replay(trace, jobs, config), None
    driver = factory()
    return replay(trace, jobs, config, driver=driver), driver.report()


# A worker's copy of the inputs every run shares (see run_all).
_inputs: tuple[Trace, list[JobSpec], PolluxDriverFactory | None] | None = None


def _load_inputs(path: str, parent_pid: int) -> None:
    """A worker's start: it dies with the replay that started it, however that ends
    (SIGKILL included: the pool's own exit never runs then), and reads the inputs."""
    global _inputs
    lifeline.die_with_parent(signal.SIGKILL, parent_pid)
    _inputs = pickle.loads(Path(path).read_bytes())


def _run_config(config: ReplayConfig) -> Run:
    assert _inputs is not None, "the pool's initializer did not run"
    return run_with_inputs(_inputs, config)


Inputs = tuple[Trace, list[JobSpec], PolluxDriverFactory | None]


def run_with_inputs(inputs: Inputs, config: ReplayConfig) -> Run:
    """One run of a sweep, from the inputs every run shares (a Slurm task runs this)."""
    trace, jobs, factory = inputs
    return _run_one((trace, jobs, config, factory))


def run_on_slurm(
    inputs: Inputs,
    configs: list[ReplayConfig],
    folder: Path,
    partition: str | None,
    account: str | None,
    time_min: int | None,
    progress: bool,
) -> tuple[list[Run], list[tuple[ReplayConfig, str, Path]]]:
    """The runs as one Slurm job array (bftrainer/replay/slurm_sweep.py): the runs that
    ended, and (config, why, log) for each task that did not."""
    try:
        from bftrainer.replay.slurm_sweep import SlurmOptions, SlurmSweepError, run_array
    except ImportError:
        raise ReplayError(
            "--executor slurm needs submitit: pip install 'bftrainer[slurm]'"
        ) from None
    options = SlurmOptions(folder, partition, account, time_min or 60)
    try:
        outcomes = run_array(run_with_inputs, inputs, configs, options, progress)
    except SlurmSweepError as e:
        raise ReplayError(str(e)) from None
    runs: list[Run] = []
    failures = []
    for config, outcome in zip(configs, outcomes, strict=True):
        if isinstance(outcome, tuple):
            runs.append(outcome)
        else:
            failures.append((config, outcome.reason, outcome.log))
    return runs, failures


def _start_pool(workers: int, inputs: Path) -> multiprocessing.pool.Pool:
    """The replay's workers, started so that a Ctrl-C is neither printed nor lost.

    Ctrl-C reaches every process of the terminal's group. The workers are born with
    SIGINT blocked (a thread's signal mask survives fork and exec, and Python never
    unblocks it): none prints a traceback while it imports, and the pool's exit
    terminates them. A Ctrl-C while they start is remembered and raised here. It was
    ignored (SIG_IGN) in that window before, and lost: the kernel hands a signal that
    the main thread blocks to another thread (OpenBLAS's), which dropped it, and the
    replay ran on for minutes.
    """
    # The resource tracker's launch unblocks SIGINT: it must not happen in the window.
    resource_tracker.ensure_running()
    interrupted: list[int] = []
    handler = signal.signal(signal.SIGINT, lambda signum, _frame: interrupted.append(signum))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        spawn = multiprocessing.get_context("spawn")
        pool = spawn.Pool(workers, _load_inputs, (str(inputs), os.getpid()))
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a pending one lands
        signal.signal(signal.SIGINT, handler)
    if interrupted:
        pool.terminate()
        raise KeyboardInterrupt
    return pool


def run_all(
    trace: Trace,
    jobs: list[JobSpec],
    configs: list[ReplayConfig],
    progress: bool,
    factory: PolluxDriverFactory | None = None,
) -> list[Run]:
    if len(configs) > 1:
        workers = min(len(configs), os.cpu_count() or 1)
        # Single-threaded BLAS in each worker: two Pollux replays side by side, each with
        # OpenBLAS's own threads, ran 8x slower on 2 cores. Spawned workers read the
        # variable when they import numpy.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        # Tasks hold only a config: a large task blocked in the pool's pipe would hang
        # the pool's exit once its workers are gone.
        with tempfile.TemporaryDirectory(prefix="bftrainer-replay-") as tmp:
            inputs = Path(tmp) / "inputs.pickle"
            inputs.write_bytes(pickle.dumps((trace, jobs, factory)))
            with _start_pool(workers, inputs) as pool:
                results = list(
                    tqdm(
                        pool.imap(_run_config, configs),
                        total=len(configs),
                        desc="replays",
                        unit="run",
                        disable=not progress or None,
                    )
                )
        return results
    with tqdm(total=1000, desc=configs[0].policy, unit="‰", disable=not progress or None) as bar:

        def update(fraction: float) -> None:
            bar.update(int(fraction * 1000) - bar.n)

        driver = factory() if factory else None
        result = replay(trace, jobs, configs[0], driver=driver, on_progress=update)
        return [(result, driver.report() if driver else None)]
