"""Loader for the Pollux simulator's application profiles (OSDI'21 artifact data).

A profile directory ``<data>/traces/<app>/`` holds (see the data's README.md):

* ``placements.csv`` (``placement,local_bsz,step_time,sync_time``): measured steps on up
  to 4 nodes x 4 GPUs; ``placement`` lists the replicas per node (``1122``).
* ``scalability.csv`` (``num_nodes,num_replicas,local_bsz,step_time,sync_time``): larger
  runs, up to 16 nodes.
* ``validation-<B>.csv`` (``progress,iteration,metric,grad_sqr,grad_var``): one row per
  epoch at total batch B; ``progress`` counts base-batch steps at the epoch's end;
  ``grad_var`` is the gradient variance **at the base batch** B0 (tr Sigma / B0).

:class:`PolluxProfile` answers what a simulated trainer needs: the step time at
(nodes, replicas, local_bsz) and the gradient statistics at (batch, progress). Step
times interpolate linearly in local_bsz between measurements of the same
(nodes, replicas), as Pollux's simulator does, and otherwise linearly over
(nodes, replicas, log local_bsz) across all measurements. Nothing is extrapolated:
a query outside the measured range raises :class:`ProfileRangeError`.

The data stay where they are (never copied into the repository): the directory is
``$BFTRAINER_POLLUX_DATA``, else ``$BFTRAINER_SHARED_DATA/pollux-sim``, else
``../shared/data/pollux-sim`` beside the repository.
"""

from __future__ import annotations

import csv
import logging
import math
import os
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from bftrainer.trainers.efficiency import pgns_from_stats
from bftrainer.trainers.throughput import StepObservation

if TYPE_CHECKING:
    from scipy.interpolate import LinearNDInterpolator

logger = logging.getLogger(__name__)

ENV_POLLUX_DATA = "BFTRAINER_POLLUX_DATA"
ENV_SHARED_DATA = "BFTRAINER_SHARED_DATA"
_REPO_ROOT = Path(__file__).resolve().parents[1]
_VALIDATION = re.compile(r"^validation-(\d+)\.csv$")


class ProfileNotFoundError(FileNotFoundError):
    """A profile directory or file is missing; the message names the path."""


class ProfileFormatError(ValueError):
    """A profile CSV with a bad header or value; the message names file and line."""


class ProfileRangeError(ValueError):
    """A query outside what the profile measured; names the application and value."""


def default_data_dir() -> Path:
    """The pollux-sim data directory (environment first, then beside the repository)."""
    if os.environ.get(ENV_POLLUX_DATA):
        return Path(os.environ[ENV_POLLUX_DATA])
    if os.environ.get(ENV_SHARED_DATA):
        return Path(os.environ[ENV_SHARED_DATA]) / "pollux-sim"
    return _REPO_ROOT.parent / "shared" / "data" / "pollux-sim"


def applications(data_dir: Path | None = None) -> list[str]:
    """Names of the applications with a profile directory under ``traces/``."""
    traces = (data_dir or default_data_dir()) / "traces"
    if not traces.is_dir():
        raise ProfileNotFoundError(f"no Pollux traces directory at {traces}")
    return sorted(p.name for p in traces.iterdir() if (p / "placements.csv").is_file())


@dataclass(frozen=True)
class ProfileStepTime:
    """Seconds per optimizer step and, within it, seconds of gradient all-reduce."""

    step_time_s: float
    sync_time_s: float


@dataclass(frozen=True)
class GradStats:
    """Gradient statistics as stored by Pollux: |g|^2 and the variance at batch B0."""

    grad_sqr: float
    grad_var: float
    base_batch_size: int

    @property
    def grad_var_per_sample(self) -> float:
        """tr(Sigma) per sample, the convention of :mod:`bftrainer.trainers.gns`."""
        return self.grad_var * self.base_batch_size

    @property
    def pgns(self) -> float:
        """phi = tr(Sigma) / |g|^2 in samples."""
        return pgns_from_stats(self.grad_sqr, self.grad_var_per_sample)


@dataclass(frozen=True)
class ValidationTable:
    """One ``validation-<B>.csv``: per-epoch end progress and statistics, as arrays."""

    batch_size: int
    progress: NDArray[np.float64]
    iteration: NDArray[np.float64]
    metric: NDArray[np.float64]
    grad_sqr: NDArray[np.float64]
    grad_var: NDArray[np.float64]

    def epoch(self, progress: float) -> int:
        """Index of the epoch under way at ``progress`` (the last epoch once past it)."""
        i = int(np.searchsorted(self.progress, progress, side="right"))
        return min(i, len(self.progress) - 1)


def _read_csv(path: Path, columns: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    if not path.is_file():
        raise ProfileNotFoundError(f"missing profile file {path}")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise ProfileFormatError(f"{path}:1: missing column(s) {', '.join(missing)}")
        return list(enumerate(reader, start=2))


def _num(path: Path, line: int, row: dict[str, str], column: str) -> float:
    try:
        value = float(row[column])
    except (TypeError, ValueError):
        raise ProfileFormatError(f"{path}:{line}: {column} is {row[column]!r}") from None
    if not math.isfinite(value):
        raise ProfileFormatError(f"{path}:{line}: {column} is {row[column]!r}")
    return value


class PolluxProfile:
    """Step times and gradient statistics of one Pollux application."""

    def __init__(self, app: str, data_dir: Path | None = None) -> None:
        self.app = app
        self.directory = (data_dir or default_data_dir()) / "traces" / app
        if not self.directory.is_dir():
            raise ProfileNotFoundError(f"no profile for application {app!r} at {self.directory}")
        self.placements = self._read_placements()
        self.scalability = self._read_scalability()
        self.validation = self._read_validation()
        self.base_batch_size = min(self.validation)
        logger.debug("loaded Pollux profile %s from %s", app, self.directory)

    # -- reading ---------------------------------------------------------------
    def _read_placements(self) -> list[tuple[str, int, int, int, float, float]]:
        """Rows (placement, nodes, replicas, local_bsz, step_time_s, sync_time_s)."""
        path = self.directory / "placements.csv"
        out = []
        for line, row in _read_csv(path, ("placement", "local_bsz", "step_time", "sync_time")):
            placement = row["placement"].strip()
            if not placement.isdigit() or "0" in placement:
                raise ProfileFormatError(f"{path}:{line}: placement is {placement!r}")
            out.append(
                (
                    placement,
                    len(placement),
                    sum(int(c) for c in placement),
                    int(_num(path, line, row, "local_bsz")),
                    _num(path, line, row, "step_time"),
                    _num(path, line, row, "sync_time"),
                )
            )
        return out

    def _read_scalability(self) -> list[tuple[int, int, int, float, float]]:
        """Rows (nodes, replicas, local_bsz, step_time_s, sync_time_s)."""
        path = self.directory / "scalability.csv"
        cols = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
        return [
            (
                int(_num(path, line, row, "num_nodes")),
                int(_num(path, line, row, "num_replicas")),
                int(_num(path, line, row, "local_bsz")),
                _num(path, line, row, "step_time"),
                _num(path, line, row, "sync_time"),
            )
            for line, row in _read_csv(path, cols)
        ]

    def _read_validation(self) -> dict[int, ValidationTable]:
        tables = {}
        cols = ("progress", "iteration", "metric", "grad_sqr", "grad_var")
        for path in sorted(self.directory.iterdir()):
            match = _VALIDATION.match(path.name)
            if not match:
                continue
            rows = _read_csv(path, cols)
            if not rows:
                raise ProfileFormatError(f"{path}: no rows")
            arr = {c: np.array([_num(path, ln, r, c) for ln, r in rows]) for c in cols}
            if np.any(np.diff(arr["progress"]) <= 0):
                raise ProfileFormatError(f"{path}: progress does not increase")
            b = int(match.group(1))
            tables[b] = ValidationTable(b, **arr)
        if not tables:
            raise ProfileNotFoundError(f"no validation-<B>.csv files in {self.directory}")
        return tables

    # -- step times ------------------------------------------------------------
    @cached_property
    def _by_config(self) -> dict[tuple[int, int], tuple[NDArray[np.float64], NDArray[np.float64]]]:
        """(nodes, replicas) -> (local_bsz, [step_time, sync_time]) means, sorted by bsz."""
        acc: dict[tuple[int, int, int], list[tuple[float, float]]] = defaultdict(list)
        for _, n, k, m, t, sync in self.placements:
            acc[(n, k, m)].append((t, sync))
        for n, k, m, t, sync in self.scalability:
            acc[(n, k, m)].append((t, sync))
        grouped: dict[tuple[int, int], list[tuple[int, float, float]]] = defaultdict(list)
        for (n, k, m), values in acc.items():
            mean = np.mean(values, axis=0)
            grouped[(n, k)].append((m, float(mean[0]), float(mean[1])))
        out = {}
        for key, rows in grouped.items():
            rows.sort()
            arr = np.array(rows)
            out[key] = (arr[:, 0], arr[:, 1:])
        return out

    @cached_property
    def _interpolator(self) -> LinearNDInterpolator:
        # Imported here: scipy.interpolate is 0.7 s of CPU, and every `bftrainer replay`
        # imports this module (the Pollux simulator), most never reading a profile.
        from scipy.interpolate import LinearNDInterpolator

        pts, vals = [], []
        for (n, k), (bsz, times) in self._by_config.items():
            for m, t in zip(bsz, times, strict=True):
                pts.append((n, k, math.log(m)))
                vals.append(t)
        return LinearNDInterpolator(np.array(pts), np.array(vals))

    def step_time(self, nodes: int, replicas: int, local_bsz: float) -> ProfileStepTime:
        """Measured (interpolated) step and sync time at K replicas over n nodes."""
        where = f"{self.app}: nodes={nodes}, replicas={replicas}, local_bsz={local_bsz}"
        if nodes < 1 or replicas < nodes or local_bsz <= 0:
            raise ProfileRangeError(f"{where}: not a valid configuration")
        entry = self._by_config.get((nodes, replicas))
        if entry is not None and len(entry[0]) >= 1:
            bsz, times = entry
            if not bsz[0] <= local_bsz <= bsz[-1]:
                raise ProfileRangeError(
                    f"{where}: local_bsz outside the measured {bsz[0]:g}..{bsz[-1]:g}"
                )
            t = float(np.interp(local_bsz, bsz, times[:, 0]))
            sync = float(np.interp(local_bsz, bsz, times[:, 1]))
            return ProfileStepTime(t, sync)
        interp = self._interpolator
        value = np.asarray(interp([(nodes, replicas, math.log(local_bsz))]))[0]
        if not np.all(np.isfinite(value)):
            raise ProfileRangeError(f"{where}: outside the measured configurations")
        return ProfileStepTime(float(value[0]), float(value[1]))

    def placement_step_time(self, placement: Sequence[int], local_bsz: float) -> ProfileStepTime:
        """Step time of an exact placement (replicas per node), rotated to Pollux's form.

        Falls back to :meth:`step_time` when the placement was not measured.
        """
        p = tuple(int(x) for x in placement if x)
        if not p:
            raise ProfileRangeError(f"{self.app}: empty placement {tuple(placement)!r}")
        canonical = "".join(map(str, min(p[i:] + p[:i] for i in range(len(p)))))
        rows = sorted((m, t, s) for pl, _, _, m, t, s in self.placements if pl == canonical)
        if not rows:
            return self.step_time(len(p), sum(p), local_bsz)
        arr = np.array(rows)
        if not arr[0, 0] <= local_bsz <= arr[-1, 0]:
            raise ProfileRangeError(
                f"{self.app}: placement {canonical}: local_bsz {local_bsz} outside the "
                f"measured {arr[0, 0]:g}..{arr[-1, 0]:g}"
            )
        return ProfileStepTime(
            float(np.interp(local_bsz, arr[:, 0], arr[:, 1])),
            float(np.interp(local_bsz, arr[:, 0], arr[:, 2])),
        )

    def observations(self, include_scalability: bool = False) -> list[StepObservation]:
        """The measured steps as throughput-fit records (no gradient accumulation)."""
        obs = [StepObservation(n, k, m, 0, t) for _, n, k, m, t, _ in self.placements]
        if include_scalability:
            obs += [StepObservation(n, k, m, 0, t) for n, k, m, t, _ in self.scalability]
        return obs

    @property
    def local_bsz_range(self) -> tuple[int, int]:
        """Smallest and largest local batch measured in ``placements.csv``."""
        ms = [m for _, _, _, m, _, _ in self.placements]
        return min(ms), max(ms)

    # -- gradient statistics and progress --------------------------------------
    @property
    def batch_sizes(self) -> list[int]:
        """Total batch sizes with a validation table, ascending."""
        return sorted(self.validation)

    @property
    def target_progress(self) -> float:
        """Progress (base-batch steps) at the end of the last epoch at the base batch."""
        return float(self.validation[self.base_batch_size].progress[-1])

    def grad_stats(self, batch_size: float, progress: float) -> GradStats:
        """|g|^2 and variance at B0 during the epoch under way at ``progress``.

        Between two profiled batch sizes both statistics interpolate linearly in
        log(batch); outside the profiled range the nearest table is used (Pollux
        normalises the variance to B0, so the tables agree up to measurement noise).
        """
        if batch_size <= 0 or progress < 0:
            raise ProfileRangeError(
                f"{self.app}: batch_size={batch_size}, progress={progress}: not valid"
            )
        sizes = self.batch_sizes
        b = min(max(float(batch_size), sizes[0]), sizes[-1])
        hi = next(s for s in sizes if s >= b)
        lo = max(s for s in sizes if s <= b)

        def at(size: int) -> tuple[float, float]:
            t = self.validation[size]
            i = t.epoch(progress)
            return float(t.grad_sqr[i]), float(t.grad_var[i])

        sqr_lo, var_lo = at(lo)
        if hi == lo:
            return GradStats(sqr_lo, var_lo, self.base_batch_size)
        sqr_hi, var_hi = at(hi)
        w = (math.log(b) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return GradStats(
            (1 - w) * sqr_lo + w * sqr_hi, (1 - w) * var_lo + w * var_hi, self.base_batch_size
        )

    def metric(self, batch_size: int, progress: float) -> float:
        """Validation metric at the end of the epoch under way (table of ``batch_size``)."""
        if batch_size not in self.validation:
            raise ProfileRangeError(
                f"{self.app}: no validation table for batch {batch_size}; have {self.batch_sizes}"
            )
        t = self.validation[batch_size]
        return float(t.metric[t.epoch(progress)])


def load_profile(app: str, data_dir: Path | None = None) -> PolluxProfile:
    """The profile of ``app`` (``cifar10``, ``bert``, ...) from ``data_dir``."""
    return PolluxProfile(app, data_dir)
