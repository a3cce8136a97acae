"""Pollux's own ground: mean JCT on Pollux's eight workloads, static 16 nodes x 4 GPUs.

The setting of Pollux's simulator (OSDI'21): a static cluster of 16 nodes with 4 GPUs
each, Pollux's workloads (``workloads*/workload-{1..8}.csv`` of the Pollux data, 160
jobs each at load 1.0; 80, 240 and 320 at loads 0.5, 1.5 and 2.0), every job a
simulated trainer that follows its application's profile (docs/goodput-replay.md). The
pool never changes (all nodes idle from the start, no events); bftrainer decides with the
milp policy, the dp solver, the goodput objective with Pollux's fairness (p = -1, speedup
over a fair share), no cap on running jobs (Pollux admits every job) and the default
T_fwd (auto, from the pool's churn). One replay per workload and load:

    python benchmarks/pollux_static.py [--loads 0.5,1.0,1.5,2.0] [--workloads 1-8]
                                       [--nodes 16] [--replicas-per-node 4]
                                       [--slots-per-node 4]
                                       [--no-batch-adapt] [--realistic]
                                       [--workers 1] [--tag T]

writes ``benchmarks/results/pollux_static[-T].{md,json}``: per load, the mean over the
workloads of each workload's mean JCT and of its mean wait before the first slot, and
each workload's figures. ``--slots-per-node S`` (S > 1) shares each node's S GPUs among
jobs, one replica per slot, each job at its placement's measured step time
(docs/allocator.md, "Slots"); it replaces ``--replicas-per-node``. ``--realistic`` runs
``workloads-realistic/`` (load 1.0 only). The data is not part of bftrainer: without it
this exits with a message.
"""

from __future__ import annotations

import os

# Single-threaded BLAS before numpy loads: replays side by side on 2 cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bftrainer.idle_monitor.trace import Trace
from bftrainer.replay.pollux.output import pollux_summary
from bftrainer.replay.pollux.sim import PolluxDriverFactory, PolluxSimOptions
from bftrainer.replay.pollux.workload import read_pollux_workload, resolve_data_dir
from bftrainer.replay.run import ReplayConfig, replay

RESULTS = Path(__file__).resolve().parent / "results"
HORIZON_S = 14 * 24 * 3600.0  # the trace's end: far past any workload's last completion
CONFIG = ReplayConfig(
    policy="milp",
    solver="dp",
    objective="goodput",
    fairness_p=-1.0,
    fair_share_speedup=True,
    max_trainers=1000,
)
KEEP = (
    "jobs_completed",
    "jobs_arrived",
    "mean_jct_s",
    "median_jct_s",
    "p95_jct_s",
    "p99_jct_s",
    "makespan_h",
    "mean_wait_before_first_slot_s",
    "median_wait_before_first_slot_s",
    "mean_statistical_efficiency",
    "rescales",
    "refits",
    "t_fwd_median",
    "wall_s",
)


@dataclass(frozen=True)
class Case:
    folder: str  # workloads, workloads-0.5, ..., workloads-realistic
    workload: int
    nodes: int
    replicas_per_node: int
    batch_adapt: bool
    slots_per_node: int = 1


def static_pool(nodes: int) -> Trace:
    """``nodes`` nodes idle from time 0 to the horizon, never changing."""
    names = tuple(f"node{i:03d}" for i in range(nodes))
    return Trace(
        nodes=names, initial_idle=frozenset(names), start_s=0.0, end_s=HORIZON_S, events=()
    )


def run_case(args: tuple[Case, Path]) -> tuple[Case, dict[str, Any]]:
    case, data = args
    path = data / case.folder / f"workload-{case.workload}.csv"
    s = case.slots_per_node
    r = case.replicas_per_node if s == 1 else 1
    w = read_pollux_workload(path, data, 0.0, replicas_per_node=r, slots_per_node=s)
    options = PolluxSimOptions(batch_adapt=case.batch_adapt, slots_per_node=s)
    driver = PolluxDriverFactory(tuple(w.apps.items()), data, options)()
    t0 = time.perf_counter()
    config = replace(CONFIG, slots_per_node=s)
    result = replay(static_pool(case.nodes), list(w.jobs), config, driver=driver)
    wall_s = time.perf_counter() - t0
    end_s = result.metrics.start_s + result.summary["hours"] * 3600
    summary = {**result.summary, **pollux_summary(result.trainers, end_s, driver.report())}
    done = [t.finished_s for t in result.trainers if t.finished_s is not None]
    summary["makespan_h"] = max(done) / 3600 if done else None
    summary["rescales"] = sum(t.rescales for t in result.trainers)
    summary["wall_s"] = wall_s
    print(
        f"{case.folder}/workload-{case.workload} S={s}: mean JCT {summary['mean_jct_s']:.0f} s, "
        f"mean wait {summary['mean_wait_before_first_slot_s']:.0f} s, "
        f"{summary['jobs_completed']}/{summary['jobs_arrived']} done, {wall_s:.0f} s wall",
        flush=True,
    )
    return case, {k: summary.get(k) for k in KEEP}


def folder(load: str, realistic: bool) -> str:
    if realistic:
        return "workloads-realistic"
    return "workloads" if float(load) == 1.0 else f"workloads-{load}"


def table(rows: list[tuple[str, list[dict[str, Any]]]]) -> str:
    """One row per load: the mean over workloads of their mean JCT, and the spread."""
    lines = [
        "| load | workloads | jobs done | mean JCT (s) | min-max over workloads | p95 (s) "
        "| mean wait before 1st slot (s) | makespan (h) | rescales/workload "
        "| wall/workload (s) |",
        "|" + "---|" * 10,
    ]
    for load, runs in rows:
        jct = [r["mean_jct_s"] for r in runs if r["mean_jct_s"] is not None]
        done = sum(r["jobs_completed"] for r in runs)
        arrived = sum(r["jobs_arrived"] for r in runs)
        lines.append(
            f"| {load} | {len(runs)} | {done}/{arrived} | {statistics.fmean(jct):,.0f} "
            f"| {min(jct):,.0f}-{max(jct):,.0f} "
            f"| {statistics.fmean(r['p95_jct_s'] for r in runs):,.0f} "
            f"| {statistics.fmean(r['mean_wait_before_first_slot_s'] for r in runs):,.0f} "
            f"| {statistics.fmean(r['makespan_h'] for r in runs):.1f} "
            f"| {statistics.fmean(r['rescales'] for r in runs):,.0f} "
            f"| {min(r['wall_s'] for r in runs):.0f}-{max(r['wall_s'] for r in runs):.0f} |"
        )
    return "\n".join(lines)


def workload_numbers(text: str) -> list[int]:
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pollux-data", type=Path, default=None)
    ap.add_argument("--loads", default="0.5,1.0,1.5,2.0")
    ap.add_argument("--workloads", default="1-8", help="e.g. 1-8 or 1,6")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--replicas-per-node", type=int, default=4)
    ap.add_argument(
        "--slots-per-node",
        type=int,
        default=1,
        help="S > 1: jobs share a node's S GPUs, one replica per slot (whole nodes: 1)",
    )
    ap.add_argument("--no-batch-adapt", action="store_true")
    ap.add_argument("--realistic", action="store_true", help="workloads-realistic/ (load 1.0)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--tag", default="", help="suffix of the output files' names")
    args = ap.parse_args()
    if args.slots_per_node < 1:
        ap.error(f"--slots-per-node {args.slots_per_node}: expected a whole number >= 1")
    try:
        data = resolve_data_dir(args.pollux_data)
    except ValueError as e:
        sys.exit(f"skipped: {e}")
    loads = ["1.0"] if args.realistic else args.loads.split(",")
    cases = [
        Case(
            folder(load, args.realistic),
            n,
            args.nodes,
            args.replicas_per_node,
            not args.no_batch_adapt,
            args.slots_per_node,
        )
        for load in loads
        for n in workload_numbers(args.workloads)
    ]
    missing = [c for c in cases if not (data / c.folder / f"workload-{c.workload}.csv").is_file()]
    if missing:
        sys.exit(f"skipped: no {missing[0].folder}/workload-{missing[0].workload}.csv in {data}")
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        outcomes = list(pool.map(run_case, [(c, data) for c in cases]))
    total_s = time.perf_counter() - t0
    rows = [
        (load, [s for c, s in outcomes if c.folder == folder(load, args.realistic)])
        for load in loads
    ]
    md = table(rows)
    stem = "pollux_static" + (f"-{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.md").write_text(md + "\n")
    (args.out / f"{stem}.json").write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "nodes": args.nodes,
                "replicas_per_node": args.replicas_per_node if args.slots_per_node == 1 else 1,
                "slots_per_node": args.slots_per_node,
                "batch_adapt": not args.no_batch_adapt,
                "config": {k: getattr(CONFIG, k) for k in ("policy", "solver", "objective")}
                | {"fairness_p": -1.0, "fair_share_speedup": True, "t_fwd_s": CONFIG.t_fwd_s},
                "total_wall_s": total_s,
                "workers": args.workers,
                "runs": [{"folder": c.folder, "workload": c.workload, **s} for c, s in outcomes],
            },
            indent=2,
        )
        + "\n"
    )
    print(md)
    print(f"\n{len(cases)} replays in {total_s:.0f} s; wrote {args.out}/{stem}.*")


if __name__ == "__main__":
    main()
