"""The scavenger baseline (a preemptible partition with requeue) against milp and equal.

Replays one workload under milp (``--solver dp``, T_fwd auto), equal share and the
scavenger policy at several rigid sizes, each at P_jmax 10 (the paper's cap, which
also caps the scavenger's running jobs) and without a cap (``--max-parallel 1000``: a
partition runs as many jobs as fit); then the best scavenger size again with other
checkpoint intervals and restart costs. U's baseline A_s depends on P_jmax, so every
row also gives its samples against milp's A_s (``u_vs_milp_baseline``), and its JCT over
the jobs that both it and milp completed.

    python benchmarks/scavenger.py --data synthetic        # 512 nodes, 24 h, 1,000 trials
    python benchmarks/scavenger.py --data summit           # week 1, 1,024 nodes, paper's set

Summit needs ``../shared/data/bftrainer-traces`` (not shipped): without it, this exits
with a message. Writes JSON to ``benchmarks/results/scavenger-<data>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
from bftrainer.idle_monitor.trace import Trace, load_trace
from bftrainer.loop.jobs import JobSpec
from bftrainer.replay.run import ReplayConfig, ReplayResult, replay
from bftrainer.replay.workload import hpo_workload, read_paper_jobs

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "bftrainer-traces"
SIZES = (64, 32, 16, 8, 4, 2, 1)
UNCAPPED = 1000
FIELDS = (
    "utilization_efficiency",
    "samples_processed",
    "baseline_samples",
    "trainers_completed",
    "mean_trainer_turnaround_s",
    "median_trainer_turnaround_s",
    "wasted_node_hours",
    "lost_work_node_hours",
    "restart_node_hours",
    "idle_node_hours",
    "resource_integral_node_hours",
    "kills",
    "rescale_cost_samples",
    "preemption_cost_samples",
    "wall_s",
)


def inputs(which: str, data: Path) -> tuple[Trace, list[JobSpec]]:
    if which == "synthetic":
        trace = synthetic_trace(SyntheticConfig(nodes=512, duration_s=24 * 3600.0, seed=0))
        return trace, hpo_workload(1000, trace.start_s)
    trace_file = data / "summit_week1_node_events.csv.gz"
    jobs_file = data / "hps-shufflenet-Jbnd-1000J.csv"
    if not trace_file.exists() or not jobs_file.exists():
        sys.exit(f"skipped: {trace_file} or {jobs_file} is absent")
    return load_trace(trace_file, nodes=slice(0, 1024)), read_paper_jobs(jobs_file)


def jct_s(result: ReplayResult) -> dict[str, float]:
    return {
        t.id: t.finished_s - t.job.submit_s for t in result.trainers if t.finished_s is not None
    }


def row(result: ReplayResult, milp: ReplayResult | None) -> dict[str, Any]:
    s = result.summary
    out: dict[str, Any] = {k: s[k] for k in FIELDS}
    out["max_parallel"] = result.config.max_trainers
    if milp is not None:
        out["u_vs_milp_baseline"] = s["samples_processed"] / milp.summary["baseline_samples"]
        mine, theirs = jct_s(result), jct_s(milp)
        common = sorted(set(mine) & set(theirs))
        out["jobs_done_by_both"] = len(common)
        if common:
            out["mean_jct_common_s"] = statistics.fmean(mine[j] for j in common)
            out["milp_mean_jct_common_s"] = statistics.fmean(theirs[j] for j in common)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", choices=("synthetic", "summit"), default="synthetic")
    ap.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("BFTRAINER_SHARED_DATA", DEFAULT_DATA)),
    )
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    args = ap.parse_args()
    trace, jobs = inputs(args.data, args.data_dir)
    base = ReplayConfig(solver="dp")
    rows: dict[str, dict[str, Any]] = {}

    def run(name: str, config: ReplayConfig, milp: ReplayResult | None) -> ReplayResult:
        result = replay(trace, jobs, config)
        rows[name] = row(result, milp)
        print(name, json.dumps(rows[name]), flush=True)
        return result

    milp = run("milp", replace(base, policy="milp"), None)
    rows["milp"] = row(milp, milp)
    run("equal", replace(base, policy="equal"), milp)
    best: tuple[float, int, int] = (-1.0, 0, 0)
    for size in (int(s) for s in args.sizes.split(",")):
        for cap in (base.max_trainers, UNCAPPED):
            config = replace(base, policy="scavenger", scavenger_size=size, max_trainers=cap)
            r = rows[f"scavenger-{size}-p{cap}"] = row(replay(trace, jobs, config), milp)
            print(f"scavenger-{size}-p{cap}", json.dumps(r), flush=True)
            best = max(best, (r["u_vs_milp_baseline"], size, cap))
    _, size, cap = best
    for every_s in (60.0, 1800.0):
        config = replace(
            base,
            policy="scavenger",
            scavenger_size=size,
            max_trainers=cap,
            checkpoint_every_s=every_s,
        )
        run(f"scavenger-{size}-p{cap}-ckpt{every_s:g}", config, milp)
    for restart_s in (0.0, 120.0):
        config = replace(
            base, policy="scavenger", scavenger_size=size, max_trainers=cap, restart_s=restart_s
        )
        run(f"scavenger-{size}-p{cap}-restart{restart_s:g}", config, milp)
    out = Path(f"benchmarks/results/scavenger-{args.data}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"data": args.data, "runs": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
