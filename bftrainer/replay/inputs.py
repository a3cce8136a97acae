"""What ``bftrainer replay`` replays: its trace and its workload, from the options given.

The trace is a file or the embedded synthetic default; the workload a paper job set, a
built-in one (hpo, diverse) or Pollux's applications with the factory of their driver.
Each function takes plain values (the command has parsed its options) and raises
:class:`~bftrainer.replay.run.ReplayError` with one line naming what is wrong, which
the command reports as a usage error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
from bftrainer.idle_monitor.trace import (
    Trace,
    TraceFormatError,
    TraceRangeError,
    load_trace,
)
from bftrainer.loop.jobs import JobSpec
from bftrainer.replay.pollux.sim import PolluxDriverFactory, PolluxSimOptions
from bftrainer.replay.pollux.workload import (
    PolluxWorkloadError,
    generate_pollux_workload,
    read_pollux_workload,
    resolve_data_dir,
    resolve_workload_path,
)
from bftrainer.replay.run import ReplayError
from bftrainer.replay.workload import WorkloadError, diverse_workload, hpo_workload, read_paper_jobs


def replay_trace(
    path: str | None,
    node_slice: slice | None,
    start_s: float | None,
    end_s: float | None,
    synthetic_nodes: int,
    synthetic_hours: float,
    seed: int,
) -> Trace:
    """The trace at ``path``, or without one the synthetic default; cut to
    ``node_slice`` and [``start_s``, ``end_s``] when given."""
    try:
        if path is None:
            trace = synthetic_trace(
                SyntheticConfig(nodes=synthetic_nodes, duration_s=synthetic_hours * 3600, seed=seed)
            )
            if node_slice or start_s is not None or end_s is not None:
                trace = trace.slice(nodes=node_slice, start_s=start_s, end_s=end_s)
            return trace
        return load_trace(path, nodes=node_slice, start_s=start_s, end_s=end_s)
    except (TraceFormatError, TraceRangeError, ValueError) as e:
        raise ReplayError(str(e)) from None
    except OSError as e:
        raise ReplayError(f"{path}: {e.strerror}") from None


def workload_record(
    jobs_path: str | None, workload: str, pollux_workload: str | None, count: int
) -> dict[str, Any]:
    """What summary.json says was replayed."""
    if jobs_path:
        return {"name": "jobs", "file": str(jobs_path), "jobs": count}
    return {"name": workload, "file": pollux_workload, "jobs": count}


def workload_jobs(
    jobs_path: str | None,
    profiles_path: str | None,
    workload: str,
    count: int,
    model: str,
    interval_s: float,
    seed: int,
    trace: Trace,
) -> list[JobSpec]:
    """A paper job set (``jobs_path``, with its profiles) or the built-in ``workload``
    (hpo or diverse), submitted from the trace's start."""
    try:
        if jobs_path:
            return read_paper_jobs(Path(jobs_path), Path(profiles_path) if profiles_path else None)
        if workload == "hpo":
            return hpo_workload(count, trace.start_s, model=model, interval_s=interval_s)
        return diverse_workload(count, trace.start_s, mean_interarrival_s=interval_s, seed=seed)
    except WorkloadError as e:
        raise ReplayError(str(e)) from None


def pollux_jobs(
    data: str | None,
    workload_file: str | None,
    batch_adapt: bool,
    count: int,
    interval_s: float,
    seed: int,
    trace: Trace,
    replicas_per_node: int = 1,
    slots_per_node: int = 1,
) -> tuple[list[JobSpec], PolluxDriverFactory]:
    """Jobs of Pollux's applications, submitted from the trace's start, and the factory
    of their driver; a node runs ``replicas_per_node`` replicas of a job, or with
    ``slots_per_node`` S > 1, one replica per slot of several jobs."""
    if slots_per_node > 1 and replicas_per_node != 1:
        raise ReplayError(
            "--replicas-per-node gives a whole node's replicas to one job; with "
            "--slots-per-node a slot is one replica: give one of them"
        )
    try:
        data_dir = resolve_data_dir(data)
        if workload_file is not None:
            path = resolve_workload_path(workload_file, data_dir)
            w = read_pollux_workload(
                path,
                data_dir,
                trace.start_s,
                replicas_per_node=replicas_per_node,
                slots_per_node=slots_per_node,
            )
        else:
            w = generate_pollux_workload(
                count,
                trace.start_s,
                data_dir,
                mean_interarrival_s=interval_s,
                seed=seed,
                replicas_per_node=replicas_per_node,
                slots_per_node=slots_per_node,
            )
    except PolluxWorkloadError as e:
        raise ReplayError(str(e)) from None
    options = PolluxSimOptions(batch_adapt=batch_adapt, seed=seed, slots_per_node=slots_per_node)
    return list(w.jobs), PolluxDriverFactory(tuple(w.apps.items()), data_dir, options)
