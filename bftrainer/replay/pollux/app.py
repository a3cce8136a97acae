"""The ground truth of Pollux's measured applications, for simulated trainers.

Every application of Pollux's simulator data (``traces/<app>/``) is a :class:`SimApp`:
its batch limits as Pollux's simulator sets them, the configuration a requested batch
turns into, the true step time of a configuration (the profile's measurements,
interpolated; outside them a fit to all of them), and the statistical gain of a step,
constant within the segments that every epoch end of every validation table splits
progress into. The driver (``pollux_sim.py``) runs trainers on this truth; what a trainer
observes and fits of it is the agent's business (``bftrainer.trainers.agent``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from bftrainer.trainers.agent import TrainerConfig
from bftrainer.trainers.efficiency import step_gain
from bftrainer.trainers.goodput import BatchLimits
from bftrainer.trainers.pollux_profiles import (
    PolluxProfile,
    ProfileRangeError,
    load_profile,
)
from bftrainer.trainers.throughput import ThroughputModel, fit_throughput

log = logging.getLogger(__name__)

# Pollux's applications.py bounds yolov3's local batch below what placements.csv measured
# (memory); every other bound is the profile's own range.
MAX_LOCAL_BSZ = {"yolov3": 8}


class PolluxSimError(ValueError):
    """The driver was used or configured in a way it cannot simulate; names the value."""


@dataclass(frozen=True)
class PolluxJob:
    """What a job runs: its application and, without batch adaptation, its local batch.

    ``local_bsz`` is the samples per replica of one step when the batch size is not
    adapted (the total batch then grows with the replicas).
    """

    app: str
    local_bsz: int
    replicas_per_node: int = 1


def app_limits(profile: PolluxProfile) -> BatchLimits:
    """Batch limits as Pollux's simulator sets them: M0 and M_max from the validation
    tables, the local batch range from placements.csv (yolov3: at most 8)."""
    lo, hi = profile.local_bsz_range
    return BatchLimits(
        base_batch_size=profile.base_batch_size,
        max_batch_size=max(profile.batch_sizes),
        max_local_bsz=max(lo, min(hi, MAX_LOCAL_BSZ.get(profile.app, hi))),
        min_local_bsz=lo,
    )


@dataclass(frozen=True)
class SegmentStats:
    """Gradient statistics within one epoch segment at one total batch, and its gain."""

    grad_sqr: float
    grad_var: float  # per sample (tr Sigma), the convention of bftrainer.trainers.gns
    gain: float  # base-batch steps per step


class SimApp:
    """The ground truth of one application: step times, gains, configurations.

    Statistical progress is split into segments at every epoch end of every validation
    table; the gradient statistics (hence the gain) are constant within a segment.
    """

    def __init__(self, profile: PolluxProfile, replicas_per_node: int = 1) -> None:
        if replicas_per_node < 1:
            raise PolluxSimError(f"replicas_per_node is {replicas_per_node}, expected >= 1")
        self.profile = profile
        self.name = profile.app
        self.replicas_per_node = replicas_per_node
        self.limits = app_limits(profile)
        self.target_progress = profile.target_progress
        self.boundaries = np.unique(
            np.concatenate([t.progress for t in profile.validation.values()])
        )
        self._times: dict[tuple[int, ...], tuple[float, float, bool]] = {}
        self._stats: dict[tuple[int, int], SegmentStats] = {}
        self._after: dict[int, NDArray[np.float64]] = {}
        self._fallback: ThroughputModel | None = None

    # -- limits ------------------------------------------------------------------
    @cached_property
    def max_nodes(self) -> int:
        """The largest node count the profile measured at r replicas per node, within
        the batch limits (every replica needs ``min_local_bsz``)."""
        obs = self.profile.observations(include_scalability=True)
        measured = min(max(o.nodes for o in obs), max(o.replicas for o in obs) // self.r)
        feasible = self.limits.max_batch_size // (self.r * self.limits.min_local_bsz)
        return max(1, min(measured, feasible))

    @cached_property
    def max_replicas(self) -> int:
        """Slots: the largest replica count the profile measured, within the batch limits
        (every replica needs ``min_local_bsz``)."""
        obs = self.profile.observations(include_scalability=True)
        feasible = self.limits.max_batch_size // self.limits.min_local_bsz
        return max(1, min(max(o.replicas for o in obs), feasible))

    @property
    def r(self) -> int:
        return self.replicas_per_node

    # -- configurations ------------------------------------------------------------
    def config(self, nodes: int, local_bsz: int, replicas: int | None = None) -> TrainerConfig:
        """``local_bsz`` samples per replica on ``nodes`` nodes, as Pollux's simulator
        turns a requested batch into one: at least ``min_local_bsz``, accumulate past
        ``max_local_bsz``, accumulate to reach M0, and stay within M_max (fewer micro-steps
        first, then a smaller local batch). ``replicas``: default nodes x r (slots: the
        job's slots over ``nodes`` shared nodes)."""
        lim = self.limits
        k = nodes * self.r if replicas is None else replicas
        if nodes < 1 or local_bsz < 1:
            raise PolluxSimError(f"{self.name}: nodes={nodes}, local_bsz={local_bsz}: not valid")
        local_bsz = max(local_bsz, lim.min_local_bsz)
        accum = -(-local_bsz // lim.max_local_bsz) - 1
        atomic = -(-local_bsz // (accum + 1))
        if k * atomic * (accum + 1) < lim.base_batch_size:
            accum = -(-lim.base_batch_size // (k * atomic)) - 1
        if k * atomic * (accum + 1) > lim.max_batch_size:
            accum = max(0, lim.max_batch_size // (k * atomic) - 1)
            atomic = min(atomic, lim.max_batch_size // (k * (accum + 1)))
        if atomic < lim.min_local_bsz:
            raise PolluxSimError(
                f"{self.name}: {nodes} node(s) x {self.r} replica(s) cannot keep "
                f"min_local_bsz {lim.min_local_bsz} within max_batch_size {lim.max_batch_size}"
            )
        return TrainerConfig(nodes, k, atomic, accum)

    def default_config(self, nodes: int, replicas: int | None = None) -> TrainerConfig:
        """Pollux's choice before any fit: the smallest batch >= M0 that gives every
        replica at least ``min_local_bsz``."""
        k = nodes * self.r if replicas is None else replicas
        batch = max(self.limits.base_batch_size, self.limits.min_local_bsz * k)
        return self.config(nodes, -(-batch // k), replicas)

    # -- truth -----------------------------------------------------------------------
    def step_time(
        self, config: TrainerConfig, placement: tuple[int, ...] | None = None
    ) -> tuple[float, bool]:
        """True seconds per optimizer step, and whether it came from the fallback fit.
        ``placement`` (slots: replicas per node) uses its row of placements.csv when
        measured, as Pollux's simulator does."""
        key: tuple[int, ...] = (config.nodes, config.replicas, config.local_bsz)
        if placement is not None:
            key = (*key, -1, *placement)
            hit = self._times.get(key)
            if hit is None:
                try:
                    st = self.profile.placement_step_time(placement, config.local_bsz)
                    hit = (st.step_time_s, st.step_time_s - st.sync_time_s, False)
                except ProfileRangeError:  # not measured at this batch: by (nodes, replicas)
                    hit = self._times_at(config)
                self._times[key] = hit
        else:
            hit = self._times_at(config)
        step_s, compute_s, fallback = hit
        return step_s + config.accum_steps * compute_s, fallback

    def _times_at(self, config: TrainerConfig) -> tuple[float, float, bool]:
        """(step, compute, fallback) at (nodes, replicas, local batch)."""
        key = (config.nodes, config.replicas, config.local_bsz)
        hit = self._times.get(key)
        if hit is None:
            try:
                st = self.profile.step_time(*key)
                hit = (st.step_time_s, st.step_time_s - st.sync_time_s, False)
            except ProfileRangeError:
                fit = self._fallback_fit()
                p = fit.params
                hit = (float(fit.step_time_s(*key)), p.alpha_grad_s + p.beta_grad_s * key[2], True)
            self._times[key] = hit
        return hit

    def _fallback_fit(self) -> ThroughputModel:
        if self._fallback is None:
            self._fallback = fit_throughput(self.profile.observations(include_scalability=True))
            log.info("%s: step times outside the profile come from its fit", self.name)
        return self._fallback

    @cached_property
    def samples_per_pass(self) -> float:
        """A pass over the data set: the base batch's first epoch, in samples (at the base
        batch a step is one base-batch step of progress)."""
        base = self.profile.validation[self.limits.base_batch_size]
        return self.limits.base_batch_size * float(base.progress[0])

    def passes(self, samples: float) -> int:
        """Passes over the data set completed after ``samples``: the live runtime's
        epoch (its sampler's), which a large batch completes in less progress."""
        return int(samples // self.samples_per_pass)

    def segment(self, progress: float) -> int:
        return int(np.searchsorted(self.boundaries, progress, side="right"))

    def segment_end(self, segment: int) -> float:
        return float(self.boundaries[segment]) if segment < len(self.boundaries) else math.inf

    def steps_to_target(self, batch_size: int, progress: float) -> float:
        """Optimizer steps at ``batch_size`` from ``progress`` to the target."""
        seg = self.segment(progress)
        end = min(self.segment_end(seg), self.target_progress)
        head = max(end - progress, 0.0) / self.stats(batch_size, seg).gain
        after = self._after.get(batch_size)
        if after is None:
            after = self._after[batch_size] = self._steps_after(batch_size)
        return head + float(after[seg])

    def _steps_after(self, batch_size: int) -> NDArray[np.float64]:
        """after[s]: steps at ``batch_size`` from the end of segment s to the target."""
        starts = np.concatenate(([0.0], self.boundaries))
        ends = np.minimum(np.append(self.boundaries, np.inf), self.target_progress)
        lengths = np.maximum(ends - starts, 0.0)
        steps = np.zeros(len(lengths))
        for i in np.flatnonzero(lengths > 0):
            g = self.profile.grad_stats(batch_size, float(starts[i]))
            steps[i] = lengths[i] / step_gain(batch_size, self.limits.base_batch_size, g.pgns)
        return np.append(np.cumsum(steps[::-1])[::-1][1:], 0.0)

    def stats(self, batch_size: int, segment: int) -> SegmentStats:
        """Gradient statistics and gain of a step at ``batch_size`` in ``segment``."""
        key = (batch_size, segment)
        hit = self._stats.get(key)
        if hit is None:
            progress = 0.0 if segment == 0 else float(self.boundaries[segment - 1])
            g = self.profile.grad_stats(batch_size, progress)
            gain = step_gain(batch_size, self.limits.base_batch_size, g.pgns)
            hit = SegmentStats(g.grad_sqr, g.grad_var_per_sample, gain)
            self._stats[key] = hit
        return hit


@lru_cache(maxsize=64)
def sim_app(app: str, data_dir: Path, replicas_per_node: int = 1) -> SimApp:
    """One :class:`SimApp` per application, data directory and r, per process."""
    return SimApp(load_profile(app, data_dir), replicas_per_node)
