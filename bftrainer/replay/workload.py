"""Workloads for the replay: the paper's job-set files and built-in generators."""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from bftrainer.common.names import NotRegularFileError, open_regular, repeated_column
from bftrainer.idle_monitor.trace import parse_time_s
from bftrainer.loop.jobs import JobSpec
from bftrainer.replay.zoo import ZOO_SPS, zoo_curve

DEFAULT_WORK_SAMPLES = 130_000_000.0  # about 100 ImageNet epochs, as the paper's job sets


class WorkloadError(ValueError):
    """A job-set file or generator option is wrong; the message names file, line and value."""


def profiles_path_for(bounds: Path) -> Path:
    """The paper's naming: ``X-Jbnd-N.csv`` has its profiles in ``X-JNPs-N.csv``."""
    if "-Jbnd-" not in bounds.name:
        raise WorkloadError(
            f"{bounds}: cannot find its profiles file by name (no '-Jbnd-'); use --profiles"
        )
    return bounds.with_name(bounds.name.replace("-Jbnd-", "-JNPs-"))


def read_paper_jobs(bounds: Path, profiles: Path | None = None) -> list[JobSpec]:
    """Read a paper job set: bounds and costs (``*-Jbnd-*.csv``), profiles (``*-JNPs-*.csv``).

    Optional ``user`` and ``account`` columns name each job's owner, for fairness by
    user or account (absent or empty: the one default owner)."""
    profiles = profiles or profiles_path_for(bounds)
    curves = _read_profiles(profiles)
    jobs = []
    for line, row in _rows(bounds, ("job", "Tcup", "Tcdw", "Jmin", "Jmax", "Pmax", "Tsub")):
        where = f"{bounds}:{line}"
        job = row["job"]
        if job not in curves:
            raise WorkloadError(f"{where}: job {job!r} has no profile in {profiles}")
        try:
            submit_s = parse_time_s(row["Tsub"])
        except ValueError as e:
            raise WorkloadError(f"{where}: Tsub: {e}") from None
        jobs.append(
            JobSpec(
                id=job,
                model=job.split("-", 1)[1] if "-" in job else "job",
                submit_s=submit_s,
                n_min=_int(row["Jmin"], where, "Jmin"),
                n_max=_int(row["Jmax"], where, "Jmax"),
                rescale_up_s=_float(row["Tcup"], where, "Tcup"),
                rescale_down_s=_float(row["Tcdw"], where, "Tcdw"),
                work_samples=_float(row["Pmax"], where, "Pmax"),
                curve=curves[job],
                user=(row.get("user") or "").strip(),
                account=(row.get("account") or "").strip(),
            )
        )
    if not jobs:
        raise WorkloadError(f"{bounds}: no jobs")
    jobs.sort(key=lambda j: (j.submit_s, j.id))
    return jobs


def _read_profiles(path: Path) -> dict[str, tuple[tuple[float, float], ...]]:
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for line, row in _rows(path, ("job", "nodes", "throughput_samples_per_s")):
        where = f"{path}:{line}"
        n = _float(row["nodes"], where, "nodes")
        if n > 0:
            points[row["job"]].append(
                (n, _float(row["throughput_samples_per_s"], where, "throughput"))
            )
    return {job: tuple(sorted(p)) for job, p in points.items()}


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """The rows of a job set's CSV file with their line numbers; a row with fewer or
    more fields than the header is named (``csv.DictReader`` fills the missing with
    None and files the extra under None)."""
    try:
        # A FIFO or a device found by name is refused, never waited on (open_regular).
        with open_regular(path) as raw, io.TextIOWrapper(raw, newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise WorkloadError(f"{path}: missing column {missing[0]!r}")
            twice = repeated_column(header)
            if twice is not None:
                raise WorkloadError(f"{path}:1: column {twice!r} appears more than once")
            rows = []
            for row in reader:
                if None in row or None in row.values():
                    given = (
                        len(row) - 1 + len(row[None])
                        if None in row
                        else sum(v is not None for v in row.values())
                    )
                    raise WorkloadError(
                        f"{path}:{reader.line_num}: {given} field(s) where the header has "
                        f"{len(header)}"
                    )
                rows.append((reader.line_num, row))
            return rows
    except NotRegularFileError as e:
        raise WorkloadError(str(e.strerror)) from None
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read: {e.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise WorkloadError(f"{path}: not a CSV text file ({e})") from None


def _float(text: str, where: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise WorkloadError(f"{where}: {name} is {text!r}, expected a number") from None
    if not math.isfinite(value) or value < 0:
        raise WorkloadError(f"{where}: {name} is {text!r}, expected a finite number >= 0")
    return value


def _int(text: str, where: str, name: str) -> int:
    value = _float(text, where, name)
    if value != int(value) or value < 1:
        raise WorkloadError(f"{where}: {name} is {text!r}, expected a whole number >= 1")
    return int(value)


def hpo_workload(
    count: int,
    start_s: float,
    *,
    model: str = "shufflenet",
    interval_s: float = 36.0,
    n_max: int = 64,
    work_samples: float = DEFAULT_WORK_SAMPLES,
) -> list[JobSpec]:
    """N identical trials of one zoo model, one every ``interval_s`` (the paper's HPO set:
    ShuffleNet, every 36 s, 18 s up / 12 s down)."""
    curve = zoo_curve(model)
    return [
        JobSpec(
            id=f"hpo{i:05d}",
            model=model,
            submit_s=start_s + i * interval_s,
            n_min=1,
            n_max=n_max,
            rescale_up_s=18.0,
            rescale_down_s=12.0,
            work_samples=work_samples,
            curve=curve,
        )
        for i in range(count)
    ]


def diverse_workload(
    count: int,
    start_s: float,
    *,
    mean_interarrival_s: float = 36.0,
    seed: int = 0,
    n_max: int = 64,
    work_samples: float = DEFAULT_WORK_SAMPLES,
) -> list[JobSpec]:
    """Models cycled from the zoo (Table 2), Poisson arrivals, costs ~U(17,19) up and
    ~U(11,13) down, as the paper's ImageNet job set."""
    rng = np.random.default_rng(seed)
    models = list(ZOO_SPS)
    arrivals = (
        start_s + np.cumsum(rng.exponential(mean_interarrival_s, count)) - mean_interarrival_s
    )
    return [
        JobSpec(
            id=f"job{i:05d}-{models[i % len(models)]}",
            model=models[i % len(models)],
            submit_s=float(max(start_s, arrivals[i])),
            n_min=1,
            n_max=n_max,
            rescale_up_s=float(rng.uniform(17, 19)),
            rescale_down_s=float(rng.uniform(11, 13)),
            work_samples=work_samples,
            curve=zoo_curve(models[i % len(models)]),
        )
        for i in range(count)
    ]
