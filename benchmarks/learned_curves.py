"""What unknown curves cost: U with the jobs' profiles known, and learned online.

First week of the Summit log, 1,024-node slice, P_jmax 10, T_fwd auto, ``--solver dp``;
the ShuffleNet HPO set (``hps-shufflenet-*-1000J.csv``) and the ImageNet set
(``ImageNet-imgps-*-1001J.csv``: seven models in turn). For each set and policy (milp,
equal): U with known curves, and with learned curves under each prior, U's ratio to
known, and U over trainers in their first 10 minutes and after
(bftrainer/replay/learning.py). Writes JSON and prints one line per run.

    python benchmarks/learned_curves.py [--data DIR] [--sets hpo,imagenet]
        [--policies milp,equal] [--curves known,optimistic,peers,profile] [--hours H]
        [--noise 0.05] [--observe 30] [--growth 2] [--redecide 60]

The data is not part of bftrainer (no licence): without it this exits with a message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from bftrainer.idle_monitor.trace import load_trace
from bftrainer.replay.learning import AgedDriver
from bftrainer.replay.run import ReplayConfig, age_utilization, replay
from bftrainer.replay.workload import read_paper_jobs

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "bftrainer-traces"
SETS = {"hpo": "hps-shufflenet-Jbnd-1000J.csv", "imagenet": "ImageNet-imgps-Jbnd-1001J.csv"}
FIELDS = (
    "utilization_efficiency",
    "rescale_cost_samples",
    "preemption_cost_samples",
    "probe_cost_samples",
    "trainers_completed",
    "decisions",
    "measurements",
    "utilization_first_10_min",
    "utilization_after_10_min",
    "wall_s",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", type=Path, default=Path(os.environ.get("BFTRAINER_SHARED_DATA", DEFAULT_DATA))
    )
    ap.add_argument("--sets", default="hpo,imagenet")
    ap.add_argument("--policies", default="milp,equal")
    ap.add_argument(
        "--curves",
        default="known,optimistic,peers,profile",
        help="known and/or the priors of learned curves to run (the ratio needs known)",
    )
    ap.add_argument("--hours", type=float, help="replay only the first H hours")
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--observe", type=float, default=30.0)
    ap.add_argument("--growth", type=float, default=2.0)
    ap.add_argument("--redecide", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/learned_curves.json"))
    args = ap.parse_args()
    trace_file = args.data / "summit_week1_node_events.csv.gz"
    if not trace_file.exists():
        sys.exit(f"skipped: {trace_file} is absent")
    trace = load_trace(trace_file, nodes=slice(0, 1024))
    runs: dict[str, dict[str, object]] = {}
    for name in args.sets.split(","):
        jobs = read_paper_jobs(args.data / SETS[name])
        t = trace
        if args.hours:
            start = max(trace.start_s, jobs[0].submit_s)
            t = trace.slice(start_s=start, end_s=start + args.hours * 3600)
        for policy in args.policies.split(","):
            base = ReplayConfig(policy=policy, solver="dp", redecide_every_s=args.redecide)
            known = None
            labels = args.curves.split(",")
            variants = [("known", base)] * ("known" in labels) + [
                (
                    p,
                    replace(
                        base,
                        curves="learned",
                        curves_prior=p,
                        curves_noise=args.noise,
                        curves_observe_s=args.observe,
                        curves_growth=args.growth,
                    ),
                )
                for p in labels
                if p != "known"
            ]
            for label, config in variants:
                if label == "known":
                    driver = AgedDriver()
                    s = replay(t, jobs, config, driver=driver).summary
                    young, older = age_utilization(driver, s)
                    s = {**s, "utilization_first_10_min": young, "utilization_after_10_min": older}
                    known = s["utilization_efficiency"]
                else:
                    s = replay(t, jobs, config).summary
                row = {k: s.get(k) for k in FIELDS}
                row["ratio_to_known"] = s["utilization_efficiency"] / known if known else None
                key = f"{name}/{policy}/{label}"
                runs[key] = row
                print(key, json.dumps(row), flush=True)
    result = {
        "setup": {
            "trace": str(trace_file),
            "nodes": "0:1024",
            "hours": args.hours,
            "noise": args.noise,
            "observe_s": args.observe,
            "growth": args.growth,
            "redecide_every_s": args.redecide,
        },
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
