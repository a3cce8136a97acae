"""The BFTrainer paper's HPO experiment, replayed: fidelity and speed in one run.

First week of the Summit idle-node log, 1,024-node slice, the 1,000-trial ShuffleNet set,
P_jmax 10, T_fwd 120 s. Runs the equal-share baseline and the milp policy with the dp
and HiGHS solvers; writes U, costs and events per second next to the paper's figures and
the reference replayer's (../shared/notes/replay-metrics.md) as JSON.

    python benchmarks/replay_summit.py [--data DIR] [--solvers dp,highs] [--hours H]

The data is not part of bftrainer (no licence): without it this exits with a message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bftrainer.idle_monitor.trace import load_trace
from bftrainer.replay.run import ReplayConfig, replay
from bftrainer.replay.workload import read_paper_jobs

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "bftrainer-traces"
PAPER = {"milp_U": 0.80, "equal_U": 0.75}
# The authors' replayer on this week and slice, run with CBC.
REFERENCE = {
    "equal_full_week": {
        "U": 0.760,
        "rescale_cost_samples": 1.06e10,
        "preemption_cost_samples": 3.27e9,
        "replay_minutes": 13.9,
    },
    "milp_cbc_first_24h": {"U": 0.613, "rescale_cost_samples": 2.33e7, "events_per_s": 0.3},
}
FIELDS = (
    "hours",
    "events",
    "eq_nodes",
    "utilization_efficiency",
    "samples_processed",
    "baseline_samples",
    "rescale_cost_samples",
    "preemption_cost_samples",
    "trainers_completed",
    "solver_timeouts",
    "mean_solve_s",
    "wall_s",
    "events_per_s",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", type=Path, default=Path(os.environ.get("BFTRAINER_SHARED_DATA", DEFAULT_DATA))
    )
    ap.add_argument("--solvers", default="dp,highs")
    ap.add_argument("--hours", type=float, help="replay only the first H hours")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/replay_summit.json"))
    args = ap.parse_args()
    trace_file = args.data / "summit_week1_node_events.csv.gz"
    jobs_file = args.data / "hps-shufflenet-Jbnd-1000J.csv"
    if not trace_file.exists() or not jobs_file.exists():
        sys.exit(f"skipped: {trace_file} or {jobs_file} is absent")
    jobs = read_paper_jobs(jobs_file)
    trace = load_trace(trace_file, nodes=slice(0, 1024))
    start = max(trace.start_s, jobs[0].submit_s)
    if args.hours:
        trace = trace.slice(start_s=start, end_s=start + args.hours * 3600)
    runs = {}
    configs = [("equal", ReplayConfig(policy="equal"))] + [
        (f"milp-{s}", ReplayConfig(policy="milp", solver=s)) for s in args.solvers.split(",")
    ]
    for name, config in configs:
        s = replay(trace, jobs, config).summary
        runs[name] = {k: s[k] for k in FIELDS}
        print(name, json.dumps(runs[name]), flush=True)
    result = {
        "setup": "Summit week 1, nodes 0:1024, hps-shufflenet 1000J, P_jmax 10, default T_fwd",
        "t_fwd_s": ReplayConfig().t_fwd_s,
        "runs": runs,
        "paper": PAPER,
        "reference_replayer": REFERENCE,
    }
    if "equal" in runs and "milp-dp" in runs:
        result["milp_over_equal_rescale_cost"] = (
            runs["milp-dp"]["rescale_cost_samples"] / runs["equal"]["rescale_cost_samples"]
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
