"""Throughput vs speedup vs goodput objectives, with and without batch-size adaptation.

Pollux's workload (``workloads/workload-1.csv``: 160 jobs of six applications, submitted
over 8 h) replayed on the idle nodes of the first Summit week (1,024-node slice, from the
BFTrainer paper's start, 2021-02-10 20:21:15, to the log's end) with simulated trainers
that follow Pollux's application profiles (docs/goodput-replay.md). The milp policy with
the dp solver, T_fwd 120 s, P_jmax 10, one run per objective:

- ``throughput``: samples/s (the trainers' fitted throughput curves);
- ``speedup``: the same curves over their 1-node value;
- ``goodput``: samples/s at the base batch's statistical value, plain sum (p = 1);
- ``goodput-fair``: goodput as speedup over a fair share, Pollux's p = -1;

each with batch-size adaptation on (``best_config(n)`` at every rescale and report) and
off (the user's batch per replica). Writes a table (Markdown and JSON) and plots to
``benchmarks/results/``:

    python benchmarks/pollux_compare.py [--nodes 0:1024] [--hours H] [--workers 2]
                                        [--workload workloads/workload-1.csv] [--tag T]
                                        [--seeds 0,1,2]

Every case runs once per seed of the trainers' observation noise; the table gives the
means over seeds (and the spread of the mean JCT), the plots the first seed.

The data is not part of bftrainer: without it this exits with a message.
"""

from __future__ import annotations

import os

# Single-threaded BLAS before numpy loads: two replays side by side, each with OpenBLAS's
# own threads, ran 8x slower on 2 cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bftrainer.idle_monitor.trace import Trace, load_trace, parse_time_s
from bftrainer.loop import TrainerState
from bftrainer.replay.pollux.output import pollux_summary
from bftrainer.replay.pollux.plots import plot_completion, plot_efficiency
from bftrainer.replay.pollux.sim import PolluxDriverFactory, PolluxReport, PolluxSimOptions
from bftrainer.replay.pollux.workload import (
    PolluxWorkload,
    read_pollux_workload,
    resolve_data_dir,
    resolve_workload_path,
)
from bftrainer.replay.run import ReplayConfig, replay

SHARED = Path(
    os.environ.get("BFTRAINER_SHARED_DATA")
    or Path(__file__).resolve().parents[2] / "shared" / "data"
)
TRACE = SHARED / "bftrainer-traces" / "summit_week1_node_events.csv.gz"
START = "2021-02-10 20:21:15"  # the paper's replay start (its first job's submission)
OBJECTIVES: dict[str, dict[str, Any]] = {
    "throughput": {"objective": "throughput"},
    "speedup": {"objective": "speedup"},
    "goodput": {"objective": "goodput"},
    "goodput-fair": {"objective": "goodput", "fairness_p": -1.0, "fair_share_speedup": True},
}
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Case:
    name: str
    config: ReplayConfig
    batch_adapt: bool


KEEP = (
    "objective",
    "fairness_p",
    "fair_share_speedup",
    "batch_adapt",
    "seed",
    "hours",
    "events",
    "eq_nodes",
    "utilization_efficiency",
    "samples_processed",
    "rescale_cost_samples",
    "preemption_cost_samples",
    "jobs_completed",
    "jobs_arrived",
    "mean_jct_s",
    "median_jct_s",
    "p95_jct_s",
    "p99_jct_s",
    "max_jct_s",
    "mean_jct_censored_s",
    "makespan_h",
    "statistical_efficiency",
    "mean_statistical_efficiency",
    "rescales",
    "refits",
    "reports",
    "fallback_time_share",
    "mean_model_error",
    "wall_s",
    "events_per_s",
)


def run_case(
    args: tuple[Case, int, Trace, PolluxWorkload],
) -> tuple[Case, dict[str, Any], PolluxReport, list[TrainerState]]:
    case, seed, trace, workload = args
    factory = PolluxDriverFactory(
        tuple(workload.apps.items()),
        workload.data_dir,
        PolluxSimOptions(batch_adapt=case.batch_adapt, seed=seed),
    )
    driver = factory()
    result = replay(trace, list(workload.jobs), case.config, driver=driver)
    report = driver.report()
    end_s = result.metrics.start_s + result.summary["hours"] * 3600
    summary = {**result.summary, **pollux_summary(result.trainers, end_s, report), "seed": seed}
    done = [t.finished_s for t in result.trainers if t.finished_s is not None]
    summary["makespan_h"] = (max(done) - result.metrics.start_s) / 3600 if done else None
    summary["rescales"] = sum(t.rescales for t in result.trainers)
    print(
        f"{case.name} seed {seed}: {summary['wall_s']:.0f} s, {summary['events']} events",
        flush=True,
    )
    return case, {k: summary.get(k) for k in KEEP}, report, result.trainers


def mean_over_seeds(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric field averaged over the seeds; ``mean_jct_sd_s`` is the spread."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        values = [r[key] for r in runs]
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if numeric and all(v is not None for v in values):
            out[key] = statistics.fmean(values)
    jct = [r["mean_jct_s"] for r in runs if r["mean_jct_s"] is not None]
    out["mean_jct_sd_s"] = statistics.stdev(jct) if len(jct) > 1 else 0.0
    out["seeds"] = len(runs)
    return out


def table(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    def h(v: float | None) -> str:
        return "-" if v is None else f"{v / 3600:.2f}"

    def f(v: float | None, fmt: str = ".3f") -> str:
        return "-" if v is None else format(v, fmt)

    head = (
        "| run | batch | done | mean JCT (h) | median | p95 | p99 | makespan (h) | U "
        "| stat. efficiency | useful share | rescales | wall (s) |"
    )
    lines = [head, "|" + "---|" * 13]
    for name, s in rows:
        spread = f" ± {s['mean_jct_sd_s'] / 3600:.2f}" if s["seeds"] > 1 else ""
        lines.append(
            f"| {name} | {'adaptive' if s['batch_adapt'] else 'fixed'} "
            f"| {s['jobs_completed']:.0f}/{s['jobs_arrived']:.0f} | {h(s['mean_jct_s'])}{spread} "
            f"| {h(s['median_jct_s'])} | {h(s['p95_jct_s'])} | {h(s['p99_jct_s'])} "
            f"| {f(s['makespan_h'], '.1f')} | {f(s['utilization_efficiency'], '.4f')} "
            f"| {f(s['mean_statistical_efficiency'])} | {f(s['statistical_efficiency'])} "
            f"| {s['rescales']:,.0f} | {s['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--pollux-data", type=Path, default=None)
    ap.add_argument("--workload", default="workloads/workload-1.csv")
    ap.add_argument("--nodes", default="0:1024")
    ap.add_argument("--hours", type=float, help="replay only the first H hours")
    ap.add_argument("--objectives", default=",".join(OBJECTIVES))
    ap.add_argument("--seeds", default="0,1,2", help="seeds of the observation noise")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--tag", default="", help="suffix of the output files' names")
    args = ap.parse_args()
    try:
        data = resolve_data_dir(args.pollux_data)
    except ValueError as e:
        sys.exit(f"skipped: {e}")
    if not args.trace.exists():
        sys.exit(f"skipped: {args.trace} is absent")
    lo, hi = (int(x) for x in args.nodes.split(":"))
    start = parse_time_s(START)
    end = start + args.hours * 3600 if args.hours else None
    t0 = time.perf_counter()
    trace = load_trace(args.trace, nodes=slice(lo, hi), start_s=start, end_s=end)
    workload = read_pollux_workload(resolve_workload_path(args.workload, data), data, start)
    print(f"loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    seeds = [int(x) for x in args.seeds.split(",")]
    cases = [
        Case(
            f"{name}-{'adaptive' if adapt else 'fixed'}",
            ReplayConfig(policy="milp", solver="dp", **OBJECTIVES[name]),
            adapt,
        )
        for name in args.objectives.split(",")
        for adapt in (False, True)
    ]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        work = [(c, seed, trace, workload) for seed in seeds for c in cases]
        outcomes = list(pool.map(run_case, work))
    total_s = time.perf_counter() - t0
    per_case = {c.name: [s for oc, s, _, _ in outcomes if oc == c] for c in cases}
    rows = [(name, mean_over_seeds(runs)) for name, runs in per_case.items()]
    args.out.mkdir(parents=True, exist_ok=True)
    md = table(rows)
    stem = "pollux_compare" + (f"-{args.tag}" if args.tag else "")
    (args.out / f"{stem}.md").write_text(md + "\n")
    (args.out / f"{stem}.json").write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "trace": str(args.trace.name),
                "nodes": args.nodes,
                "start": START,
                "workload": args.workload,
                "seeds": seeds,
                "total_wall_s": total_s,
                "workers": args.workers,
                "runs": {name: {"mean": row, "seeds": per_case[name]} for name, row in rows},
            },
            indent=2,
        )
        + "\n"
    )
    first = [(c.name, rep, tr) for c, s, rep, tr in outcomes if s["seed"] == seeds[0]]
    plot_efficiency([(n, rep) for n, rep, _ in first], args.out / f"{stem}-efficiency.png")
    plot_completion([(n, tr) for n, _, tr in first], args.out / f"{stem}-jct.png")
    print(md)
    print(
        f"\n{len(work)} replays in {total_s:.0f} s with {args.workers} workers; "
        f"wrote {args.out}/{stem}.*"
    )


if __name__ == "__main__":
    main()
