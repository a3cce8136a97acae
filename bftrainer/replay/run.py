"""Replay a pool trace through the core loop on a virtual clock.

The replay is the daemon's loop (``bftrainer.loop.run``) with the trace and the job list
as sources, a :class:`~bftrainer.loop.VirtualClock` and a simulated driver.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bftrainer.common.promise import promise_error
from bftrainer.idle_monitor.trace import Trace, format_time
from bftrainer.loop import (
    Arrival,
    Loop,
    LoopState,
    Policy,
    PoolChange,
    Step,
    TimedSource,
    TrainerDriver,
    TrainerState,
    VirtualClock,
)
from bftrainer.loop.jobs import JobSpec
from bftrainer.policies.config import ANY, POLICY_NEEDS, POLICY_TABLES, Config, ConfigError
from bftrainer.policies.registry import POLICIES as POLICY_REGISTRY
from bftrainer.policies.registry import MilpPolicy, ScavengerPolicy, make_policy
from bftrainer.replay.allocations import AllocationChange, RecordingDriver
from bftrainer.replay.learning import (
    CURVES,
    AgedDriver,
    LearningDriver,
    LearningError,
    LearningOptions,
    PriorArrivals,
)
from bftrainer.replay.metrics import (
    MetricsRecorder,
    baseline_samples,
    best_split_sps,
    limit_samples,
    reference_curve,
    utilization,
)
from bftrainer.replay.rigid import DEFAULT_CHECKPOINT_EVERY_S, CheckpointRestartDriver
from bftrainer.replay.search import (
    SEARCH_PRUNERS,
    SEARCH_SEED_MAX,
    SEARCH_TRIALS_MAX,
    SEARCHES,
    SearchSource,
    node_seconds,
)
from bftrainer.replay.simulator import SimulatedDriver, Waste
from bftrainer.replay.windows import WINDOW_MODES, WindowKnowledge, events_with_windows

# The realistic windows' limits, the flags' and the config's alike: a departure known
# at most ~32 years ahead (beyond, say nothing: the default), stated within 1e7 s.
MAX_WINDOWS_LEAD_S = 1e9
MAX_WINDOWS_ERROR_S = 1e7
POLICIES = tuple(POLICY_REGISTRY)


class ReplayError(ValueError):
    """A replay cannot run with these inputs; the message says which and why."""


@dataclass(frozen=True)
class ReplayConfig(Config):
    """The loop's configuration plus what only the replay needs: the window of the
    per-window U, what the pool source knows of departures (bftrainer/replay/
    windows.py: ``windows`` none | oracle | realistic, and the realistic one's share
    known, lead time and error), and how the scavenger policy's rigid jobs checkpoint
    and restart (bftrainer/replay/rigid.py; ``restart_s`` None: each job's R_up)."""

    window_s: float = 6 * 3600.0
    windows: str = "none"
    windows_known_share: float = 1.0
    windows_lead_s: float = math.inf
    windows_error_s: float = 0.0
    checkpoint_every_s: float = DEFAULT_CHECKPOINT_EVERY_S
    restart_s: float | None = None
    # What the policy knows of the trainers' curves (bftrainer/replay/learning.py).
    curves: str = "known"
    curves_prior: str = "peers"
    curves_noise: float = 0.05
    curves_observe_s: float = 30.0
    curves_growth: float = 2.0
    curves_seed: int = 0
    # A search (bftrainer/replay/search.py): None replays the job list as it is.
    search: str | None = None
    search_pruner: str = "asha"
    search_trials: int = 100
    search_seed: int = 0
    # Promise: milp weighs a trial's objective term by search_promise ** (rungs passed).
    search_promise: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.curves not in CURVES:
            raise ConfigError(f"curves = {self.curves!r}: expected one of {', '.join(CURVES)}")
        try:
            self.learning_options  # noqa: B018 (validates)
        except LearningError as e:
            raise ConfigError(f"curves_{e}") from None
        c = self.checkpoint_every_s
        if isinstance(c, bool) or not isinstance(c, int | float) or not (0 < c < math.inf):
            raise ConfigError(f"checkpoint_every_s = {c!r}: expected a finite number > 0")
        r = self.restart_s
        if r is not None and (
            isinstance(r, bool) or not isinstance(r, int | float) or not (0 <= r < math.inf)
        ):
            raise ConfigError(f"restart_s = {r!r}: expected a finite number >= 0 (seconds)")
        if self.search is not None and self.search not in SEARCHES:
            raise ConfigError(f"search = {self.search!r}: expected one of {', '.join(SEARCHES)}")
        if self.search_pruner not in SEARCH_PRUNERS:
            raise ConfigError(
                f"search_pruner = {self.search_pruner!r}: expected one of "
                f"{', '.join(SEARCH_PRUNERS)}"
            )
        for name, first, last, why in (
            ("search_trials", 1, SEARCH_TRIALS_MAX, "--trials' limit"),
            ("search_seed", 0, SEARCH_SEED_MAX, "a sampler's 32-bit seed"),
        ):
            k = getattr(self, name)
            if isinstance(k, bool) or not isinstance(k, int) or not first <= k <= last:
                raise ConfigError(
                    f"{name} = {k!r}: expected a whole number from {first} to {last} ({why})"
                )
        promise = promise_error(self.search_promise)
        if promise is not None:
            raise ConfigError(promise)
        w = self.window_s
        if isinstance(w, bool) or not isinstance(w, int | float) or not (0 < w < math.inf):
            raise ConfigError(f"window_s = {w!r}: expected a finite number > 0")
        if self.windows not in WINDOW_MODES:
            raise ConfigError(
                f"windows = {self.windows!r}: expected one of {', '.join(WINDOW_MODES)}"
            )
        for name, lo, hi in (
            ("windows_known_share", 0.0, 1.0),
            ("windows_lead_s", 0.0, MAX_WINDOWS_LEAD_S),
            ("windows_error_s", 0.0, MAX_WINDOWS_ERROR_S),
        ):
            v = getattr(self, name)
            if name == "windows_lead_s" and v == math.inf:
                continue  # the default: known from the join
            if isinstance(v, bool) or not isinstance(v, int | float) or not (lo <= v <= hi):
                raise ConfigError(f"{name} = {v!r}: expected a number in [{lo:g}, {hi:g}]")

    @property
    def learning_options(self) -> LearningOptions:
        return LearningOptions(
            prior=self.curves_prior,
            noise=self.curves_noise,
            observe_s=self.curves_observe_s,
            growth=self.curves_growth,
            seed=self.curves_seed,
        )

    @property
    def window_knowledge(self) -> WindowKnowledge:
        return WindowKnowledge(
            self.windows, self.windows_known_share, self.windows_lead_s, self.windows_error_s
        )


# Settings that mean nothing without another: refused, not ignored (``refuse_unused``).
_LEARNED = ("curves", "learned", '--curves learned (curves = "learned")')
_SEARCH = ("search", ANY, '--search (search = "tpe" or "random")')
_REALISTIC = ("windows", "realistic", '--windows realistic (windows = "realistic")')
REPLAY_NEEDS: dict[str, tuple[str, Any, str]] = {
    **POLICY_NEEDS,
    **{f"curves_{k}": _LEARNED for k in ("prior", "noise", "observe_s", "growth", "seed")},
    **{f"search_{k}": _SEARCH for k in ("pruner", "trials", "seed", "promise")},
    **{f"windows_{k}": _REALISTIC for k in ("known_share", "lead_s", "error_s")},
}

# The replay's tables in a configuration file (``bftrainer replay --config``).
REPLAY_TABLES: dict[str, dict[str, str]] = {
    **POLICY_TABLES,
    "replay": {
        "window_s": "window_s",
        "windows": "windows",
        "windows_known_share": "windows_known_share",
        "windows_lead_s": "windows_lead_s",
        "windows_error_s": "windows_error_s",
        "checkpoint_every_s": "checkpoint_every_s",
        "restart_s": "restart_s",
        "slots_per_node": "slots_per_node",
        "curves": "curves",
        "curves_prior": "curves_prior",
        "curves_noise": "curves_noise",
        "curves_observe_s": "curves_observe_s",
        "curves_growth": "curves_growth",
        "curves_seed": "curves_seed",
        "search": "search",
        "search_pruner": "search_pruner",
        "search_trials": "search_trials",
        "search_seed": "search_seed",
        "search_promise": "search_promise",
    },
}


@dataclass
class ReplayResult:
    config: ReplayConfig
    summary: dict[str, Any]
    metrics: MetricsRecorder
    trainers: list[TrainerState] = field(default_factory=list)
    windows: list[dict[str, float]] = field(default_factory=list)
    end_s: float = math.nan
    allocations: list[AllocationChange] = field(default_factory=list)


class _Progress:
    """The metrics recorder, plus the fraction of the trace covered after each step."""

    def __init__(
        self, metrics: MetricsRecorder, span: tuple[float, float], report: Callable[[float], None]
    ) -> None:
        self.metrics, self.span, self.report = metrics, span, report

    def interval(self, t0_s: float, t1_s: float, pool_nodes: int, processed: float) -> None:
        self.metrics.interval(t0_s, t1_s, pool_nodes, processed)
        start, end = self.span
        if end > start:
            self.report((t1_s - start) / (end - start))

    def step(self, step: Step) -> None:
        self.metrics.step(step)


def replay(
    trace: Trace,
    jobs: Sequence[JobSpec],
    config: ReplayConfig,
    *,
    policy: Policy | None = None,
    driver: TrainerDriver | None = None,
    on_progress: Callable[[float], None] | None = None,
) -> ReplayResult:
    """Run ``jobs`` on the idle nodes of ``trace`` under ``config``'s policy.

    The replay starts at the first job's submission (or the trace's start, if later) and
    ends at the trace's end, or earlier once every job has completed. ``policy``: the one
    ``config`` names, from the registry, unless given (a test's wrapper). ``driver`` simulates
    the trainers (default: ``SimulatedDriver``, progress from each job's throughput
    curve; for the scavenger policy, ``CheckpointRestartDriver``, the same progress with
    a rigid job's kills and restarts). ``on_progress`` gets the fraction of the trace's
    time covered, as it goes.
    """
    if not jobs:
        raise ReplayError("the workload has no jobs")
    jobs = sorted(jobs, key=lambda j: j.submit_s)
    if jobs[0].submit_s < trace.start_s:
        # Its JCT would count time the trace does not cover (a year early: 31.6e6 s).
        early = sum(j.submit_s < trace.start_s for j in jobs)
        raise ReplayError(
            f"{early} job(s) arrive before the trace starts ({format_time(trace.start_s)}), "
            f"the first ({jobs[0].id}) at {format_time(jobs[0].submit_s)}: give a trace "
            "that covers the workload, or a workload within the trace"
        )
    start_s = jobs[0].submit_s
    if start_s >= trace.end_s:
        raise ReplayError(
            f"the first job arrives at {format_time(jobs[0].submit_s)}, after the trace ends "
            f"({format_time(trace.end_s)})"
        )
    if start_s > trace.start_s:
        trace = trace.slice(start_s=start_s)
    check_fits(jobs, len(trace.nodes), config.slots_per_node)
    policy = policy if policy is not None else make_policy(config)
    learning = config.curves == "learned"
    if learning and (isinstance(policy, ScavengerPolicy) or config.objective == "goodput"):
        raise ReplayError(
            "--curves learned: trainers learn throughput curves for the milp (objective "
            "throughput or speedup) and equal policies"
        )
    if learning and driver is None:
        try:
            driver = LearningDriver(
                {j.id: j for j in jobs}, config.learning_options, config.slots_per_node
            )
        except LearningError as e:
            raise ReplayError(f"--curves learned: {e}") from None
    driver = driver or _simulated_driver(config, policy)
    if learning and not isinstance(driver, LearningDriver):
        raise ReplayError(
            f"--curves learned runs with the learning driver, not {type(driver).__name__}"
        )
    if isinstance(policy, ScavengerPolicy) and not isinstance(driver, CheckpointRestartDriver):
        raise ReplayError(
            "the scavenger policy replays rigid jobs that restart from checkpoints: it runs "
            f"with the checkpoint-restart driver, not {type(driver).__name__}"
        )
    wall0 = time.perf_counter()
    metrics = MetricsRecorder(start_s=start_s, window_s=config.window_s)
    arrivals: TimedSource | PriorArrivals | SearchSource = TimedSource(
        (j.submit_s, Arrival(j)) for j in jobs
    )
    if isinstance(driver, LearningDriver):
        arrivals = PriorArrivals(jobs, driver)  # the policy never sees a job's profile
    if config.search is not None:
        if learning:
            raise ReplayError("--search runs with known curves (--curves known)")
        arrivals = SearchSource(
            replace(jobs[0], submit_s=start_s),
            config.search,
            config.search_pruner,
            config.search_trials,
            seed=config.search_seed,
            max_parallel=config.max_trainers,
            promise=config.search_promise,
        )
        if isinstance(policy, MilpPolicy) and config.search_promise != 1:
            policy = replace(policy, weights=arrivals.weight)
        jobs = [replace(jobs[0], submit_s=start_s)]
    events = events_with_windows(trace, config.window_knowledge)
    pool = TimedSource((e.time_s, PoolChange(e)) for e in events)
    recorder = RecordingDriver(driver)
    loop = Loop(
        [pool, arrivals],
        recorder,
        VirtualClock(start_s),
        config,
        policy=policy,
        observer=_Progress(metrics, (start_s, trace.end_s), on_progress)
        if on_progress
        else metrics,
        state=LoopState(
            now_s=start_s, pool=tuple(sorted(trace.initial_idle, key=trace.nodes.index))
        ),
        # A search sees the loop's trainers before each step (it reads them).
        readers=[arrivals] if isinstance(arrivals, SearchSource) else [],
    )
    loop.run(until_s=trace.end_s, stop=lambda lp: arrivals.exhausted and not lp.trainers)
    wall_s = time.perf_counter() - wall0
    trainers = loop.finished + list(loop.trainers.values())
    waste = driver.waste if isinstance(driver, SimulatedDriver | CheckpointRestartDriver) else None
    result = _result(config, metrics, trainers, jobs, start_s, loop.now_s, wall_s, waste)
    result.allocations = recorder.changes
    if isinstance(arrivals, SearchSource):
        changes = [(c.time_s, c.trainer_id, c.nodes) for c in recorder.changes]
        result.summary.update(arrivals.summary(node_seconds(changes, loop.now_s)))
        result.summary["curves_prior"] = None  # the trials plan on known curves
    if isinstance(driver, LearningDriver):
        result.summary.update(learning_summary(driver, result.summary))
    return result


def _simulated_driver(config: ReplayConfig, policy: Policy) -> TrainerDriver:
    """Elastic trainers for the allocating policies; rigid, checkpointing jobs for the
    scavenger baseline."""
    if isinstance(policy, ScavengerPolicy):
        return CheckpointRestartDriver(config.checkpoint_every_s, config.restart_s)
    return SimulatedDriver(config.slots_per_node)


def check_fits(jobs: Sequence[JobSpec], nodes: int, slots_per_node: int) -> None:
    """Refuse a job whose n_min exceeds every slot the trace ever has: it would wait
    forever."""
    most = nodes * slots_per_node
    for j in jobs:
        if j.n_min > most:
            unit = "nodes" if slots_per_node == 1 else "slots"
            raise ReplayError(
                f"job {j.id!r}: n_min {j.n_min} {unit} exceeds the pool's {most} "
                f"({nodes} nodes x {slots_per_node} slots)"
            )


def _result(
    config: ReplayConfig,
    m: MetricsRecorder,
    trainers: list[TrainerState],
    jobs: Sequence[JobSpec],
    start_s: float,
    end_s: float,
    wall_s: float,
    waste: Waste | None = None,
) -> ReplayResult:
    elapsed = end_s - start_s
    # U's baseline is whole dedicated nodes at any S: the slot curve at S, 2S, ... slots.
    curve = reference_curve(jobs)
    if config.slots_per_node > 1:
        curve = curve[:: config.slots_per_node]
    peak_pool = max([s.pool_nodes for s in m.steps] + list(m.pool_size_s) + [1])
    best = best_split_sps(curve, config.max_trainers, peak_pool + 1)
    achieved = m.processed_samples - m.rescale_cost_samples - m.preemption_cost_samples
    limit = limit_samples(m.pool_size_s, best)
    # A curve that grows faster than linearly makes P_best convex somewhere, and the
    # pool's fluctuation then worth more than its N_eq dedicated nodes: the baseline is
    # then the limit itself, so U_max is within [0, 1] by construction (docs/replay.md).
    baseline = max(baseline_samples(elapsed, m.resource_node_s, best), limit)
    u = utilization(achieved, baseline)
    u_max = utilization(limit, baseline)
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
    waits = [t.started_s - t.job.submit_s for t in trainers if t.started_s is not None]
    decided = [s for s in m.steps if s.decided]
    summary: dict[str, Any] = {
        **{
            k: v
            for k, v in asdict(config).items()
            # search_promise: in a search's fields (SearchSource.summary), only there
            if k not in ("window_s", "t_fwd_s", "search_promise")
            and not k.startswith(("windows_", "curves"))
        },
        **_window_fields(config),
        "t_fwd": config.t_fwd_s,
        **t_fwd_range(decided),
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
        "utilization_efficiency": u,
        "limit_samples": limit,
        "utilization_limit": u_max,
        "utilization_share_of_limit": utilization(u, u_max) if math.isfinite(u_max) else math.nan,
        "rescale_cost_samples": m.rescale_cost_samples,
        "preemption_cost_samples": m.preemption_cost_samples,
        "trainers_arrived": len(trainers),
        "trainers_completed": len(done),
        "mean_trainer_runtime_s": statistics.fmean(runtimes) if runtimes else None,
        "mean_trainer_turnaround_s": statistics.fmean(turnaround) if turnaround else None,
        "median_trainer_turnaround_s": statistics.median(turnaround) if turnaround else None,
        # The wait before a trainer's first slot (node, at S = 1), over those that started.
        "mean_wait_before_first_slot_s": statistics.fmean(waits) if waits else None,
        "median_wait_before_first_slot_s": statistics.median(waits) if waits else None,
        "max_wait_before_first_slot_s": max(waits) if waits else None,
        "trainers_never_started": len(trainers) - len(waits),
        "idle_node_hours": (m.resource_node_s - m.allocated_node_s) / 3600,
        **_waste_fields(waste),
        "solver_timeouts": sum(1 for s in decided if s.status in ("time_limit", "kept_current")),
        "mean_solve_s": statistics.fmean(s.solve_s for s in decided) if decided else 0.0,
        "wall_s": wall_s,
        "events_per_s": len(m.steps) / wall_s if wall_s > 0 else None,
    }
    return ReplayResult(config, summary, m, trainers, windows, end_s)


def learning_summary(driver: LearningDriver, summary: Mapping[str, Any]) -> dict[str, Any]:
    """What learned curves add to summary.json (known curves add nothing: the summary
    stays as it was before curves could be learned)."""
    o = driver.options
    young, older = age_utilization(driver, summary)
    return {
        "curves": "learned",
        "curves_prior": o.prior,
        "curves_noise": o.noise,
        "curves_observe_s": o.observe_s,
        "curves_growth": o.growth if math.isfinite(o.growth) else None,
        "curves_seed": o.seed,
        "measurements": driver.measurements,
        "probe_cost_samples": driver.probe_cost_samples,
        "utilization_first_10_min": young,
        "utilization_after_10_min": older,
    }


def age_utilization(driver: AgedDriver, summary: Mapping[str, Any]) -> tuple[float, float]:
    """U over trainers in their first 10 minutes and after: samples net of costs per
    node-second they held, over the baseline's samples per node-second of the pool
    (A_s / R; so the two weigh held nodes as U weighs the whole pool)."""
    resource_s = summary["resource_integral_node_hours"] * 3600
    per_node_s = summary["baseline_samples"] / resource_s if resource_s > 0 else 0.0
    return driver.ages.utilization(per_node_s)


def _waste_fields(waste: Waste | None) -> dict[str, Any]:
    """Node-hours held without keeping the work (None: a driver that does not count)."""
    if waste is None:
        keys = ("wasted_node_hours", "lost_work_node_hours", "restart_node_hours", "kills")
        return dict.fromkeys(keys)
    return {
        "wasted_node_hours": waste.total_node_s / 3600,
        "lost_work_node_hours": waste.lost_node_s / 3600,
        "restart_node_hours": waste.restart_node_s / 3600,
        "kills": waste.kills,
    }


def _window_fields(config: ReplayConfig) -> dict[str, Any]:
    """The realistic windows' parameters (JSON has no inf: an unlimited lead is null)."""
    if config.windows != "realistic":
        return {}
    lead = config.windows_lead_s
    return {
        "windows_known_share": config.windows_known_share,
        "windows_lead_s": lead if math.isfinite(lead) else None,
        "windows_error_s": config.windows_error_s,
    }


def t_fwd_range(decided: list[Step]) -> dict[str, float | None]:
    """The T_fwd the policy used over the run (auto varies with the pool's churn): the
    smallest, the median over decisions and the largest; None without a look-ahead."""
    used = sorted(s.t_fwd_s for s in decided if s.t_fwd_s is not None)
    if not used:
        return {"t_fwd_min": None, "t_fwd_median": None, "t_fwd_max": None}
    return {
        "t_fwd_min": used[0],
        "t_fwd_median": statistics.median(used),
        "t_fwd_max": used[-1],
    }


def t_fwd_label(summary: Mapping[str, Any]) -> str:
    """``120`` for a fixed T_fwd; ``auto (10-3600, median 118)`` for auto, in seconds."""
    t = summary["t_fwd"]
    if not isinstance(t, str):
        return f"{t:g}"
    if summary.get("t_fwd_min") is None:
        return t
    return (
        f"{t} ({summary['t_fwd_min']:.0f}-{summary['t_fwd_max']:.0f}, "
        f"median {summary['t_fwd_median']:.0f})"
    )
