"""Replay a pool trace through the core loop on a virtual clock."""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bftrainer.idle_monitor.trace import Trace, format_time
from bftrainer.jobs import JobSpec
from bftrainer.loop import CoreLoop, Policy, TrainerDriver, TrainerState
from bftrainer.policy import EqualSharePolicy, MilpPolicy
from bftrainer.replay.metrics import (
    MetricsRecorder,
    baseline_samples,
    best_split_sps,
    reference_curve,
    utilization,
)
from bftrainer.replay.simulator import SimulatedDriver

POLICIES = ("milp", "equal")


class ReplayError(ValueError):
    """A replay cannot run with these inputs; the message says which and why."""


@dataclass(frozen=True)
class ReplayConfig:
    policy: str = "milp"
    t_fwd_s: float = 120.0
    objective: str = "throughput"
    formulation: str = "count"
    solver: str = "highs"
    time_limit_s: float = 10.0
    max_trainers: int = 10
    window_s: float = 6 * 3600.0
    fairness_p: float = 1.0
    fair_share_speedup: bool = False

    def make_policy(self) -> Policy:
        if self.policy == "milp":
            return MilpPolicy(
                t_fwd_s=self.t_fwd_s,
                objective=self.objective,
                formulation=self.formulation,
                solver=self.solver,
                time_limit_s=self.time_limit_s,
                fairness_p=self.fairness_p,
                fair_share_speedup=self.fair_share_speedup,
            )
        if self.policy == "equal":
            return EqualSharePolicy()
        raise ReplayError(f"policy {self.policy!r} is not one of {', '.join(POLICIES)}")


@dataclass
class ReplayResult:
    config: ReplayConfig
    summary: dict[str, Any]
    metrics: MetricsRecorder
    trainers: list[TrainerState] = field(default_factory=list)
    windows: list[dict[str, float]] = field(default_factory=list)


def replay(
    trace: Trace,
    jobs: Sequence[JobSpec],
    config: ReplayConfig,
    *,
    driver: TrainerDriver | None = None,
    on_progress: Callable[[float], None] | None = None,
) -> ReplayResult:
    """Run ``jobs`` on the idle nodes of ``trace`` under ``config``'s policy.

    The replay starts at the first job's submission (or the trace's start, if later) and
    ends at the trace's end, or earlier once every job has completed. ``driver`` simulates
    the trainers (default: ``SimulatedDriver``, progress from each job's throughput
    curve). ``on_progress`` gets the fraction of the trace's time covered, after each step.
    """
    if not jobs:
        raise ReplayError("the workload has no jobs")
    jobs = sorted(jobs, key=lambda j: j.submit_s)
    start_s = max(trace.start_s, jobs[0].submit_s)
    if start_s >= trace.end_s:
        raise ReplayError(
            f"the first job arrives at {format_time(jobs[0].submit_s)}, after the trace ends "
            f"({format_time(trace.end_s)})"
        )
    if start_s > trace.start_s:
        trace = trace.slice(start_s=start_s)
    wall0 = time.perf_counter()
    metrics = MetricsRecorder(start_s=start_s, window_s=config.window_s)
    loop = CoreLoop(
        policy=config.make_policy(),
        driver=driver or SimulatedDriver(),
        now_s=start_s,
        pool=dict.fromkeys(sorted(trace.initial_idle, key=trace.nodes.index)),
        max_trainers=config.max_trainers,
        observer=metrics,
    )
    arrivals = deque(jobs)
    events = iter(trace.events)
    pending = next(events, None)
    span = trace.end_s - start_s
    while True:
        t_pool = pending.time_s if pending else math.inf
        t_arrival = arrivals[0].submit_s if arrivals else math.inf
        t = min(t_pool, max(t_arrival, start_s), loop.next_completion_s())
        if t > trace.end_s or (not arrivals and not loop.trainers):
            end_s = trace.end_s if loop.trainers or arrivals else loop.now_s
            loop.advance(min(end_s, trace.end_s))
            break
        loop.advance(t)
        loop.complete_finished()
        if pending is not None and pending.time_s == t:
            loop.pool_event(pending)
            pending = next(events, None)
        while arrivals and arrivals[0].submit_s <= t:
            loop.arrive(arrivals.popleft())
        loop.decide()
        if on_progress and span > 0:
            on_progress((loop.now_s - start_s) / span)
    wall_s = time.perf_counter() - wall0
    trainers = loop.finished + list(loop.trainers.values())
    return _result(config, metrics, trainers, jobs, start_s, loop.now_s, wall_s)


def _result(
    config: ReplayConfig,
    m: MetricsRecorder,
    trainers: list[TrainerState],
    jobs: Sequence[JobSpec],
    start_s: float,
    end_s: float,
    wall_s: float,
) -> ReplayResult:
    elapsed = end_s - start_s
    curve = reference_curve(jobs)
    peak_pool = max([s.pool_nodes for s in m.steps] + [1])
    best = best_split_sps(curve, config.max_trainers, peak_pool + 1)
    achieved = m.processed_samples - m.rescale_cost_samples - m.preemption_cost_samples
    baseline = baseline_samples(elapsed, m.resource_node_s, best)
    windows = []
    for k in sorted(m.windows):
        w = m.windows[k]
        length = min(config.window_s, end_s - w.start_s)
        if length <= 0:
            continue
        w_base = baseline_samples(length, w.resource_node_s, best)
        w_achieved = w.processed_samples - w.cost_samples
        windows.append(
            {
                "start": format_time(w.start_s),
                "hours": length / 3600,
                "eq_nodes": w.resource_node_s / length,
                "samples_processed": w_achieved,
                "baseline_samples": w_base,
                "utilization_efficiency": utilization(w_achieved, w_base),
            }
        )
    done = [t for t in trainers if t.finished_s is not None]
    runtimes = [
        t.finished_s - t.started_s for t in done if t.started_s is not None and t.finished_s
    ]
    turnaround = [t.finished_s - t.job.submit_s for t in done if t.finished_s is not None]
    decided = [s for s in m.steps if s.decided]
    summary: dict[str, Any] = {
        **{k: v for k, v in asdict(config).items() if k not in ("window_s", "t_fwd_s")},
        "t_fwd": config.t_fwd_s,
        "window_hours": config.window_s / 3600,
        "start": format_time(start_s),
        "end": format_time(end_s),
        "hours": elapsed / 3600,
        "events": len(m.steps),
        "decisions": len(decided),
        "resource_integral_node_hours": m.resource_node_s / 3600,
        "eq_nodes": m.resource_node_s / elapsed if elapsed > 0 else 0.0,
        "samples_processed": achieved,
        "baseline_samples": baseline,
        "utilization_efficiency": utilization(achieved, baseline),
        "rescale_cost_samples": m.rescale_cost_samples,
        "preemption_cost_samples": m.preemption_cost_samples,
        "trainers_arrived": len(trainers),
        "trainers_completed": len(done),
        "mean_trainer_runtime_s": statistics.fmean(runtimes) if runtimes else None,
        "mean_trainer_turnaround_s": statistics.fmean(turnaround) if turnaround else None,
        "solver_timeouts": sum(1 for s in decided if s.status in ("time_limit", "kept_current")),
        "mean_solve_s": statistics.fmean(s.solve_s for s in decided) if decided else 0.0,
        "wall_s": wall_s,
        "events_per_s": len(m.steps) / wall_s if wall_s > 0 else None,
    }
    return ReplayResult(config, summary, m, trainers, windows)
