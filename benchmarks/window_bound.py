"""An upper bound on U for any policy on a replayed trace, departures known or not.

The replay's limit U_max (docs/replay.md) charges nothing for rescales or preemptions.
This bound charges what no policy can avoid under the replay's costs
(bftrainer/replay/simulator.py) and the allocator's rule of no migration (a decision
either shrinks or grows each trainer's node set, never swaps nodes):

- Removing r nodes from a trainer that had n (a preemption, or a scale-down) costs
  R_dw * O(n) >= r * c_r, with c_r = R_dw * min_k O(k) / k: every removed node pays
  at least c_r, however nodes are grouped.
- A pool node that is left idle loses at least delta(N(t)) per second against the
  limit: P_best(N) - P_best(u) >= (N - u) * min_{m <= N} (P_best(m) - P_best(m - 1)).
- So every idle interval of a node that ends inside the replay (the node leaves) costs
  at least b_i = min(c_r, its idle loss over the interval) whatever the policy does:
  either the node is in use when it leaves (preempted: c_r), or it was released before
  (c_r), or it was never used (the idle loss), or it was released by a trainer's
  completion (free) and idle from then on (the idle loss from then on).
- Completions are the only free removal. Each needs W samples of its own trainer, so
  there are at most K = A_max / W of them, each frees at most n_max nodes, and a node is
  freed by at most one (its last removal). A completion saves something on a node only
  if the node's idle loss from the completion to its departure is below c_r (about
  12 s on this curve). Departure instants linked by such nodes form clusters; a
  completion saves on one cluster's nodes only, at most b_i on each of at most n_max.
  Within a span shorter than a trainer's shortest run (W at n_max nodes, 896 s here)
  only the P_jmax trainers there at its start can complete, which caps a cluster's
  completions. The bound gives back the K largest blocks of n_max nodes' b_i over all
  clusters (the code says how).

    U <= (A_max - sum_i b_i + completion allowance) / A_s

Scale-up costs are not charged at all (a start from 0 nodes is free, and bounding how
often a policy can arrange one is harder), so the bound is loose by at most what
scale-ups must cost. It holds for one workload profile (all jobs the same curve and
costs), as the paper's HPO sets are.

    python benchmarks/window_bound.py [--data DIR] [--hours H] [--decompose [oracle|none]]

``--decompose`` also replays the milp policy (``--solver dp``, T_fwd 120 s, the windows
given) with a driver that records every preemption and rescale, and splits its loss
against the limit into the parts docs/benchmarks.md tabulates ("Windows").
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import sys
from pathlib import Path

import numpy as np

from bftrainer.idle_monitor.trace import Trace, load_trace
from bftrainer.loop import TrainerState
from bftrainer.loop.jobs import JobSpec
from bftrainer.replay.metrics import (
    baseline_samples,
    best_split_sps,
    limit_samples,
    reference_curve,
    utilization,
)
from bftrainer.replay.run import ReplayConfig, replay
from bftrainer.replay.simulator import DONE_RTOL, SimulatedDriver
from bftrainer.replay.windows import idle_intervals
from bftrainer.replay.workload import read_paper_jobs

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "bftrainer-traces"
MAX_TRAINERS = 10


def removal_cost_per_node(jobs: list[JobSpec]) -> float:
    """c_r: the least a removed node can cost, R_dw * min_k O(k) / k over whole k."""
    return min(
        j.rescale_down_s * min(j.rate_sps(k) / k for k in range(max(j.n_min, 1), j.n_max + 1))
        for j in jobs
    )


def pool_timeline(trace: Trace) -> tuple[list[float], list[int]]:
    """Times at which the pool size changes, and the size from each until the next."""
    times, sizes = [trace.start_s], [len(trace.initial_idle)]
    pool = set(trace.initial_idle)
    for e in trace.events:
        pool |= e.joined
        pool -= e.left
        times.append(e.time_s)
        sizes.append(len(pool))
    return times, sizes


def bound(trace: Trace, jobs: list[JobSpec], max_trainers: int = MAX_TRAINERS) -> dict:
    profiles = {(j.curve, j.n_max, j.n_min, j.rescale_up_s, j.rescale_down_s) for j in jobs}
    if len(profiles) != 1:
        raise SystemExit("window_bound: the bound holds for one job profile only")
    jobs = sorted(jobs, key=lambda j: j.submit_s)
    start_s = max(trace.start_s, jobs[0].submit_s)
    if start_s > trace.start_s:
        trace = trace.slice(start_s=start_s)
    end_s = trace.end_s
    times, sizes = pool_timeline(trace)
    peak = max(sizes)
    best = best_split_sps(reference_curve(jobs), max_trainers, peak + 1)
    seconds: dict[int, float] = {}
    edges = [*times[1:], end_s]
    for t0, t1, n in zip(times, edges, sizes, strict=True):
        seconds[n] = seconds.get(n, 0.0) + (t1 - t0)
    resource = sum(n * s for n, s in seconds.items())
    a_s = baseline_samples(end_s - start_s, resource, best)
    a_max = limit_samples(seconds, best)
    # delta(N): the least marginal of P_best up to N; its integral over time, F.
    marg = np.diff(best)
    delta = np.minimum.accumulate(marg)  # delta[N - 1] = min_{m <= N} (P(m) - P(m - 1))
    rate = [float(delta[n - 1]) if n > 0 else 0.0 for n in sizes]
    spans = [r * (t1 - t0) for r, t0, t1 in zip(rate, times, edges, strict=True)]
    cum = np.concatenate([[0.0], np.cumsum(spans)])

    def idle_loss(t0: float, t1: float) -> float:
        """The integral of delta(N(t)) over [t0, t1]."""

        def f(t: float) -> float:
            i = bisect.bisect_right(times, t) - 1
            return float(cum[i] + rate[i] * (t - times[i]))

        return f(t1) - f(t0)

    c_r = removal_cost_per_node(jobs)
    stays = [(n, j, left) for n, j, left in idle_intervals(trace) if left is not None]
    b = [min(c_r, idle_loss(j, left)) for _, j, left in stays]
    charged = float(sum(b))
    # Completion allowance: a completion at t frees nodes that then idle until they leave;
    # node i saves at most b_i - (idle loss from t to its departure), if positive.
    job = jobs[0]
    # A completion needs progress >= W (1 - DONE_RTOL) and progress <= processed.
    k_max = int(a_max // (job.work_samples * (1 - DONE_RTOL)))
    # Completions in a span shorter than a trainer's shortest run are at most one per
    # running trainer: only the trainers there at its start can complete within it.
    shortest_run = job.work_samples * (1 - DONE_RTOL) / max(job.rate_sps(job.n_max), 1e-300)

    def saving_span(t: float) -> float:
        """How long before t a completion can still save something on nodes leaving at
        or after t: until the idle loss up to t reaches c_r (or the replay's start)."""
        lo, hi = start_s, t
        if idle_loss(lo, t) < c_r:
            return t - lo
        for _ in range(60):  # bisection on the nondecreasing idle loss
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if idle_loss(mid, t) < c_r else (mid, hi)
        return t - lo

    # A completion at any time saves no more than one at the first departure instant at
    # or after it (the same nodes, less idling). Node i can be saved by a completion
    # mapped to an instant from e_i (the earliest with the node present and its idle
    # loss until leaving below c_r) to its own departure. Instants joined by such
    # ranges form clusters, and a completion saves only on one cluster's nodes: c
    # completions there save at most its 64 c largest b_i. Blocks of n_max, largest
    # first, capped at the completions the cluster's span allows; the K largest
    # blocks over all clusters bound what K completions save.
    instants = sorted({left for _, _, left in stays})
    index = {t: k for k, t in enumerate(instants)}
    ranges = []
    for (_, joined, left), bi in zip(stays, b, strict=True):
        k = e = index[left]
        while e > 0 and instants[e - 1] >= joined and idle_loss(instants[e - 1], left) < c_r:
            e -= 1
        ranges.append((e, k, bi))
    ranges.sort()
    clusters: list[tuple[int, int, list[float]]] = []
    for e, k, bi in ranges:
        if clusters and e <= clusters[-1][1]:
            first, last, values = clusters[-1]
            clusters[-1] = (first, max(last, k), values)
        else:
            clusters.append((e, k, []))
        clusters[-1][2].append(bi)
    blocks: list[float] = []
    for first, last, values in clusters:
        t0 = instants[first]
        span = instants[last] - t0 + saving_span(t0)
        cap = max_trainers * (1 + int(span // shortest_run))
        values.sort(reverse=True)
        chunks = range(0, len(values), job.n_max)
        blocks += [sum(values[r : r + job.n_max]) for r in chunks][:cap]
    allowance = float(sum(heapq.nlargest(k_max, blocks)))
    u_bound = utilization(a_max - charged + allowance, a_s)
    return {
        "start_s": start_s,
        "end_s": end_s,
        "hours": (end_s - start_s) / 3600,
        "peak_pool": peak,
        "baseline_samples": a_s,
        "limit_samples": a_max,
        "utilization_limit": utilization(a_max, a_s),
        "removal_cost_per_node_samples": c_r,
        "departures": len(stays),
        "unavoidable_cost_samples": charged,
        "unavoidable_cost_share": charged / a_s,
        "completions_at_most": k_max,
        "completion_allowance_samples": allowance,
        "completion_allowance_share": allowance / a_s,
        "utilization_bound": u_bound,
        "utilization_bound_without_completions": utilization(a_max - charged, a_s),
    }


class _Recording(SimulatedDriver):
    """The replay's driver, recording (old count, nodes lost or new count, cost)."""

    def __init__(self) -> None:
        super().__init__()
        self.preemptions: list[tuple[int, int, float]] = []
        self.rescales: list[tuple[int, int, float]] = []

    def preempt(self, trainer: TrainerState, old_count: int) -> float:
        cost = super().preempt(trainer, old_count)
        self.preemptions.append((old_count, old_count - len(trainer.nodes), cost))
        return cost

    def rescale(self, trainer: TrainerState, nodes: tuple[str, ...]) -> float:
        old = len(trainer.nodes)
        cost = super().rescale(trainer, nodes)
        self.rescales.append((old, len(nodes), cost))
        return cost


def decompose(trace: Trace, jobs: list[JobSpec], windows: str, t_fwd_s: float = 120.0) -> dict:
    """The milp policy's loss against the limit, in shares of A_s (one job profile)."""
    driver = _Recording()
    config = ReplayConfig(policy="milp", solver="dp", t_fwd_s=t_fwd_s, windows=windows)
    s = replay(trace, jobs, config, driver=driver).summary
    a_s = s["baseline_samples"]
    c_r = removal_cost_per_node(jobs)
    job = jobs[0]
    removed = sum(lost for _, lost, _ in driver.preemptions)
    whole_rate = sum(cost for old, lost, cost in driver.preemptions if lost < old)
    alone = sum(job.rescale_down_s * job.rate_sps(lost) for old, lost, _ in driver.preemptions)
    partial = whole_rate - sum(
        job.rescale_down_s * job.rate_sps(lost) for old, lost, _ in driver.preemptions if lost < old
    )
    costs = s["rescale_cost_samples"] + s["preemption_cost_samples"]
    return {
        "utilization_efficiency": s["utilization_efficiency"],
        "utilization_limit": s["utilization_limit"],
        "nodes_held_when_leaving": removed,
        "floor_share": removed * c_r / a_s,
        "curve_shape_share": (alone - removed * c_r) / a_s,
        "partial_hits_share": partial / a_s,
        "scale_ups_share": sum(c for old, new, c in driver.rescales if new > old) / a_s,
        "scale_downs_share": sum(c for old, new, c in driver.rescales if new < old) / a_s,
        "split_and_idle_share": (s["limit_samples"] - s["samples_processed"] - costs) / a_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--hours", type=float, default=None, help="only the first H hours")
    p.add_argument("--nodes", type=int, default=1024)
    p.add_argument("--decompose", nargs="?", const="oracle", choices=["oracle", "none"])
    args = p.parse_args()
    trace_path = args.data / "summit_week1_node_events.csv.gz"
    jobs_path = args.data / "hps-shufflenet-Jbnd-1000J.csv"
    if not trace_path.exists() or not jobs_path.exists():
        sys.exit(f"window_bound: no data in {args.data} (the Summit week and the job set)")
    jobs = read_paper_jobs(jobs_path, None)
    trace = load_trace(trace_path, nodes=slice(0, args.nodes))
    if args.hours is not None:
        start = max(trace.start_s, min(j.submit_s for j in jobs))
        trace = trace.slice(end_s=start + 3600 * args.hours)
    out = bound(trace, jobs)
    if args.decompose:
        out["decomposition"] = decompose(trace, jobs, args.decompose)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
