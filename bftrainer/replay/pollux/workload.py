"""Workloads of Pollux-profiled jobs: Pollux's workload files, or a generator.

A Pollux workload file (``<data>/workloads*/workload-N.csv``) has the columns
``name,time,application,num_replicas,batch_size``: submission ``time`` in seconds from
the start, and the GPUs and total batch the user asked for. Here the time is counted from
the replay's start; the user's batch per replica (``batch_size / num_replicas``) is the
local batch the job keeps when batch-size adaptation is off. The generator cycles the six
applications with Poisson arrivals and the base batch per replica.

Every job gets the application's node range (1 .. the largest node count the profile
measured, within its batch limits) and, as ``JobSpec.curve``, the true throughput at the
application's base batch per replica: the prior a policy sees before the trainer reports
(and the curve of U's baseline, docs/replay.md). With ``slots_per_node`` S > 1 a job
counts slots (one replica each, 1 .. the most replicas the profile measured) and its
curve is the packed placement's (S replicas per node, the rest on one more).
``work_samples`` is the job's target progress in base-batch samples (target x M0); the
job completes on statistical progress, not on samples.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bftrainer.loop.jobs import JobSpec
from bftrainer.replay.pollux.app import PolluxJob, PolluxSimError, SimApp, sim_app
from bftrainer.trainers.pollux_profiles import (
    ENV_POLLUX_DATA,
    ProfileFormatError,
    ProfileNotFoundError,
    default_data_dir,
)

log = logging.getLogger(__name__)

APPLICATIONS = ("cifar10", "imagenet", "bert", "deepspeech2", "yolov3", "ncf")
COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
# Pollux's simulator delays a job by 30 s at every reallocation (checkpoint-restart).
DEFAULT_RESCALE_S = 30.0


class PolluxWorkloadError(ValueError):
    """A Pollux data folder or workload file that cannot be used; names the path, line
    and value."""


@dataclass(frozen=True)
class PolluxWorkload:
    """The jobs as the core sees them, and what each runs (by job id), for the driver."""

    data_dir: Path
    jobs: tuple[JobSpec, ...]
    apps: Mapping[str, PolluxJob]


def resolve_data_dir(option: str | Path | None = None) -> Path:
    """``--pollux-data``, else ``$BFTRAINER_POLLUX_DATA``, else the shared data beside the
    repository; it must hold ``traces/<app>/`` for the six applications."""
    path = Path(option) if option is not None else default_data_dir()
    where = "--pollux-data" if option is not None else f"${ENV_POLLUX_DATA} or the default"
    traces = path / "traces"
    if not traces.is_dir():
        raise PolluxWorkloadError(
            f"{path} ({where}): no Pollux data there (expected {traces}/<app>/); "
            "pass --pollux-data DIR"
        )
    missing = [a for a in APPLICATIONS if not (traces / a / "placements.csv").is_file()]
    if missing:
        raise PolluxWorkloadError(f"{traces}: no profile for {', '.join(missing)}")
    return path


def resolve_workload_path(text: str, data_dir: Path) -> Path:
    """A file path; ``N`` for ``<data>/workloads/workload-N.csv``; or a path inside the
    data folder (``workloads-2.0/workload-3.csv``)."""
    if text.isdigit():
        path = data_dir / "workloads" / f"workload-{text}.csv"
    else:
        path = Path(text)
        if not path.exists() and (data_dir / text).exists():
            path = data_dir / text
    if not path.is_file():
        raise PolluxWorkloadError(f"--pollux-workload {text!r}: no such file {path}")
    return path


def _app(app: str, data_dir: Path, replicas_per_node: int, where: str) -> SimApp:
    try:
        return sim_app(app, data_dir, replicas_per_node)
    except (ProfileNotFoundError, ProfileFormatError, PolluxSimError) as e:
        raise PolluxWorkloadError(f"{where}: application {app!r}: {e}") from None


def make_job(
    job_id: str,
    app: SimApp,
    submit_s: float,
    local_bsz: int,
    *,
    n_max: int | None = None,
    rescale_up_s: float = DEFAULT_RESCALE_S,
    rescale_down_s: float = DEFAULT_RESCALE_S,
    slots_per_node: int = 1,
) -> tuple[JobSpec, PolluxJob]:
    """One job of ``app`` keeping ``local_bsz`` per replica when not adapting."""
    s = slots_per_node
    if s > 1:
        check_placements(app, s)
    cap = app.max_nodes if s == 1 else app.max_replicas
    n_hi = cap if n_max is None else min(n_max, cap)
    if n_hi < 1:
        raise PolluxWorkloadError(f"job {job_id!r}: n_max {n_max} is below 1")
    local = max(app.limits.min_local_bsz, local_bsz)
    curve = []  # the prior: true throughput at the base batch per replica
    for n in range(1, n_hi + 1):
        if s == 1:
            config = app.config(n, app.limits.base_batch_size)
            step_s, _ = app.step_time(config)
        else:
            place = packed_placement(n, s)
            config = app.config(len(place), app.limits.base_batch_size, replicas=n)
            step_s, _ = app.step_time(config, place)
        curve.append((float(n), config.batch_size / step_s))
    spec = JobSpec(
        id=job_id,
        model=app.name,
        submit_s=submit_s,
        n_min=1,
        n_max=n_hi,
        rescale_up_s=rescale_up_s,
        rescale_down_s=rescale_down_s,
        work_samples=app.target_progress * app.limits.base_batch_size,
        curve=tuple(curve),
    )
    return spec, PolluxJob(app.name, local, app.replicas_per_node)


def check_placements(app: SimApp, slots_per_node: int) -> None:
    """Slots: the profile's placements.csv must have measured S replicas on one node,
    or every packed job's step time would be a guess."""
    most = max(max(int(c) for c in row[0]) for row in app.profile.placements)
    if slots_per_node > most:
        raise PolluxWorkloadError(
            f"{app.profile.directory / 'placements.csv'}: measures at most {most} replicas "
            f"per node; --slots-per-node {slots_per_node} does not match this profile"
        )


def packed_placement(slots: int, slots_per_node: int) -> tuple[int, ...]:
    """Replicas per node of ``slots`` on the fewest nodes, ascending (1 4 4 for 9 of 4)."""
    full, rest = divmod(slots, slots_per_node)
    return tuple(([rest] if rest else []) + [slots_per_node] * full)


def read_pollux_workload(
    path: Path,
    data_dir: Path,
    start_s: float,
    *,
    replicas_per_node: int = 1,
    n_max: int | None = None,
    rescale_up_s: float = DEFAULT_RESCALE_S,
    rescale_down_s: float = DEFAULT_RESCALE_S,
    slots_per_node: int = 1,
) -> PolluxWorkload:
    """Jobs of a Pollux workload file, submitted at ``start_s`` + their ``time``."""
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise PolluxWorkloadError(f"{path}:1: missing column {missing[0]!r}")
            rows = list(enumerate(reader, start=2))
    except OSError as e:
        raise PolluxWorkloadError(f"{path}: cannot read: {e.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise PolluxWorkloadError(f"{path}: not a CSV text file ({e})") from None
    jobs, apps = [], {}
    for line, row in rows:
        where = f"{path}:{line}"
        name = (row["name"] or "").strip()
        if not name:
            raise PolluxWorkloadError(f"{where}: name is empty")
        if name in apps:
            raise PolluxWorkloadError(f"{where}: job {name!r} appears twice")
        app_name = (row["application"] or "").strip()
        if app_name not in APPLICATIONS:
            raise PolluxWorkloadError(
                f"{where}: application is {app_name!r}, expected one of {', '.join(APPLICATIONS)}"
            )
        time_s = _number(row["time"], where, "time", minimum=0.0)
        replicas = _number(row["num_replicas"], where, "num_replicas", minimum=1.0)
        batch = _number(row["batch_size"], where, "batch_size", minimum=1.0)
        app = _app(app_name, data_dir, replicas_per_node, where)
        spec, job = make_job(
            name,
            app,
            start_s + time_s,
            math.ceil(batch / replicas),
            n_max=n_max,
            rescale_up_s=rescale_up_s,
            rescale_down_s=rescale_down_s,
            slots_per_node=slots_per_node,
        )
        jobs.append(spec)
        apps[name] = job
    if not jobs:
        raise PolluxWorkloadError(f"{path}: no jobs")
    jobs.sort(key=lambda j: (j.submit_s, j.id))
    log.info("read %d Pollux jobs from %s", len(jobs), path)
    return PolluxWorkload(data_dir, tuple(jobs), apps)


def generate_pollux_workload(
    count: int,
    start_s: float,
    data_dir: Path,
    *,
    mean_interarrival_s: float = 180.0,
    seed: int = 0,
    replicas_per_node: int = 1,
    n_max: int | None = None,
    rescale_up_s: float = DEFAULT_RESCALE_S,
    rescale_down_s: float = DEFAULT_RESCALE_S,
    slots_per_node: int = 1,
) -> PolluxWorkload:
    """``count`` jobs cycling the six applications, Poisson arrivals (the first at
    ``start_s``), each keeping its application's base batch per replica when not adapting."""
    if count < 1:
        raise PolluxWorkloadError(f"job count is {count}, expected >= 1")
    if not (math.isfinite(mean_interarrival_s) and mean_interarrival_s >= 0):
        raise PolluxWorkloadError(
            f"mean interarrival is {mean_interarrival_s!r} s, expected a finite number >= 0"
        )
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(mean_interarrival_s, count) if mean_interarrival_s > 0 else None
    jobs, apps = [], {}
    t = start_s
    for i in range(count):
        if gaps is not None and i:
            t += float(gaps[i])
        name = APPLICATIONS[i % len(APPLICATIONS)]
        app = _app(name, data_dir, replicas_per_node, "generator")
        jid = f"{name}-{i}"
        spec, job = make_job(
            jid,
            app,
            t,
            app.limits.base_batch_size,
            n_max=n_max,
            rescale_up_s=rescale_up_s,
            rescale_down_s=rescale_down_s,
            slots_per_node=slots_per_node,
        )
        jobs.append(spec)
        apps[jid] = job
    return PolluxWorkload(data_dir, tuple(jobs), apps)


def _number(text: str | None, where: str, name: str, minimum: float) -> float:
    try:
        value = float(text or "")
    except ValueError:
        raise PolluxWorkloadError(f"{where}: {name} is {text!r}, expected a number") from None
    if not math.isfinite(value) or value < minimum:
        raise PolluxWorkloadError(
            f"{where}: {name} is {text!r}, expected a finite number >= {minimum:g}"
        )
    return value
