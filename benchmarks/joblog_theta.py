"""A second machine from its job log: ALCF Theta's 2022, converted, described and replayed.

Runs what a centre would, as commands:

1. ``bftrainer trace from-log`` on the whole year (wall time and peak memory, from
   ``/usr/bin/time``'s figures where it exists, else ``resource``);
2. ``bftrainer trace stats`` on the log (the paper's Table 1 row, fragments, quiet spells);
3. ``bftrainer replay LOG`` on whole weeks of the machine with the paper's ShuffleNet HPO
   set and its ImageNet set, their arrivals moved to the week (``--shift-arrivals
   start``), under milp (``--solver dp``), equal and scavenger; milp values the ImageNet
   set (seven models) by speedup (``OBJECTIVES``);
4. the scavenger partition at rigid sizes 4, 16 and 32 on the first week;
5. one week under milp with the windows the log's plan states (``trace``, the default for
   a job log), none, and the true ones (``oracle``);
6. a workload that can use this machine's pool (``--parts pool``): 100 trainers at once
   (``--max-parallel 100``) fed by a stream of the built-in ShuffleNet trials, one every
   36 s (the paper's spacing) for ``--pool-hours`` from each week's start, under milp,
   equal and the scavenger at 64, 16 and 8 nodes. Ten trainers of at most 64 nodes hold
   640 nodes; Theta's pool averages about 1,000.

    python benchmarks/joblog_theta.py [--data DIR] [--weeks 2022-01-10,2022-10-10] [--out DIR]
                                      [--parts paper,pool] [--pool-hours 24]

Writes ``results.json`` in --out (default benchmarks/results/theta). The data is not part
of bftrainer: without it this exits with a message.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
# milp's objective per set. A sample of AlexNet costs a sixth of the node-time of one of
# vgg16, and every trainer of a set must finish: valued by throughput, milp feeds the
# fast models first and is left with slow ones in its slots (docs/benchmarks.md,
# "milp against equal"). Speedup values a trainer's progress in the node-time it saves,
# as the paper's own ImageNet-spdup profile does. One curve (ShuffleNet): either.
OBJECTIVES = {"shufflenet": "throughput", "imagenet": "speedup"}
SETS = {
    "shufflenet": "bftrainer-traces/hps-shufflenet-Jbnd-1000J.csv",
    "imagenet": "bftrainer-traces/ImageNet-imgps-Jbnd-1001J.csv",
}
# Step 6: a workload that can use a pool of ~1,000 nodes (module docstring).
POOL_TRAINERS = 100
POOL_INTERVAL_S = 36.0
POOL_SCAVENGER_SIZES = (16, 8)
FIELDS = (
    "utilization_efficiency",  # U
    "utilization_limit",  # U_max
    "rescale_cost_samples",
    "preemption_cost_samples",
    "trainers_completed",
    "eq_nodes",
    "hours",
    "events",
    "events_per_s",
)


def run(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """The command's result, wall seconds and the peak memory of children (MB)."""
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "bftrainer", *argv], capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - began
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if done.returncode != 0:
        raise SystemExit(f"bftrainer {' '.join(argv)} failed:\n{done.stderr}")
    return done, wall, peak_mb


def summaries(out: Path) -> dict[str, dict[str, Any]]:
    rows = {}
    for path in sorted(out.glob("*/summary.json")):
        s = json.loads(path.read_text())
        rows[path.parent.name] = {
            k: s.get(k) for k in (*FIELDS, "arrival_shift_s", "windows", "objective")
        }
    return rows


def week_end(week: str) -> str:
    """The day a week that starts on ``week`` (YYYY-mm-dd, UTC) ends."""
    start = datetime.strptime(week, "%Y-%m-%d").replace(tzinfo=UTC)
    return (start + timedelta(days=7)).strftime("%Y-%m-%d")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    # Two weeks of normal service (2022-01-10 opens with 7 h of no job: docs/benchmarks.md).
    parser.add_argument("--weeks", default="2022-01-10,2022-10-10")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/theta"))
    parser.add_argument("--skip-convert", action="store_true")
    parser.add_argument("--parts", default="paper,pool", help="paper: steps 1-5; pool: step 6")
    parser.add_argument("--pool-hours", type=float, default=24.0)
    args = parser.parse_args()
    log = args.data / "hpc-job-logs" / "theta_2022.swf.gz"
    if not log.exists():
        raise SystemExit(f"{log} is absent: this benchmark needs ../shared/data")
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    parts = args.parts.split(",")
    if "paper" in parts:
        paper_sets(args, log, results)
    if "pool" in parts:
        for week in args.weeks.split(","):
            results[f"{week} pool"] = pool_workload(args, log, week)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))


def pool_workload(args: argparse.Namespace, log: Path, week: str) -> dict[str, Any]:
    """Step 6: P_jmax 100 and a stream of trials for ``--pool-hours`` from ``week``."""
    start = datetime.strptime(week, "%Y-%m-%d").replace(tzinfo=UTC)
    end = (start + timedelta(hours=args.pool_hours)).strftime("%Y-%m-%dT%H:%M:%S")
    count = int(args.pool_hours * 3600 / POOL_INTERVAL_S) + 1
    common = [
        "replay", str(log), "--start", week, "--end", end, "--workload", "hpo",
        "--jobs-count", str(count), "--interval", f"{POOL_INTERVAL_S:g}",
        "--max-parallel", str(POOL_TRAINERS), "--solver", "dp", "--no-progress",
    ]  # fmt: skip
    found: dict[str, Any] = {}
    out = args.out / f"{week}-pool"
    _, wall, _ = run([*common, "--policy", "milp,equal,scavenger", "--out", str(out)])
    found["wall_s"] = round(wall, 1)
    found["runs"] = summaries(out)
    for size in POOL_SCAVENGER_SIZES:
        sized = args.out / f"{week}-pool-scavenger-{size}"
        run([*common, "--policy", "scavenger", "--scavenger-size", str(size), "--out", str(sized)])
        summary = json.loads((sized / "summary.json").read_text())
        found["runs"][f"scavenger-{size}"] = {k: summary.get(k) for k in FIELDS}
    print(week, "pool", json.dumps(found), flush=True)
    return found


def paper_sets(args: argparse.Namespace, log: Path, results: dict[str, Any]) -> None:
    """Steps 1-5: the conversion, the stats and the paper's job sets on whole weeks."""
    if not args.skip_convert:
        year = args.out / "year.csv.gz"
        done, wall, peak = run(["trace", "from-log", str(log), "--out", str(year)])
        results["convert"] = {"wall_s": round(wall, 1), "peak_mb": round(peak), "said": done.stdout}
        print("convert", results["convert"], flush=True)
    done, wall, _ = run(["trace", "stats", str(log), "--json"])
    results["stats"] = {**json.loads(done.stdout), "wall_s": round(wall, 1)}
    brief = {k: results["stats"][k] for k in ("events", "inc_per_h", "eq_nodes")}
    print("stats", brief, flush=True)
    for week in args.weeks.split(","):
        end = week_end(week)
        for name, jobs in SETS.items():
            out = args.out / f"{week}-{name}"
            argv = [
                "replay", str(log), "--start", week, "--end", end,
                "--jobs", str(args.data / jobs), "--shift-arrivals", "start",
                "--policy", "milp,equal,scavenger", "--solver", "dp", "--no-progress",
                "--objective", OBJECTIVES[name],
                "--out", str(out),
            ]  # fmt: skip
            _, wall, _ = run(argv)
            results[f"{week} {name}"] = {"wall_s": round(wall, 1), "runs": summaries(out)}
            print(week, name, results[f"{week} {name}"], flush=True)
    week = args.weeks.split(",")[0]
    end = week_end(week)
    for name, jobs in SETS.items():
        for size in (4, 16, 32):
            out = args.out / f"{week}-{name}-scavenger-{size}"
            run([
                "replay", str(log), "--start", week, "--end", end, "--jobs",
                str(args.data / jobs), "--shift-arrivals", "start", "--policy", "scavenger",
                "--scavenger-size", str(size), "--no-progress", "--out", str(out),
            ])  # fmt: skip
            summary = json.loads((out / "summary.json").read_text())
            results[f"{week} {name} scavenger {size}"] = {k: summary.get(k) for k in FIELDS}
            print(week, name, "scavenger", size, summary.get("utilization_efficiency"), flush=True)
    for windows in ("trace", "none", "oracle"):
        out = args.out / f"{week}-windows-{windows}"
        run([
            "replay", str(log), "--start", week, "--end", end, "--jobs",
            str(args.data / SETS["shufflenet"]), "--shift-arrivals", "start", "--policy", "milp",
            "--solver", "dp", "--windows", windows, "--no-progress", "--out", str(out),
        ])  # fmt: skip
        summary = json.loads((out / "summary.json").read_text())
        results[f"windows {windows}"] = summary.get("utilization_efficiency")
        print("windows", windows, results[f"windows {windows}"], flush=True)


if __name__ == "__main__":
    main()
