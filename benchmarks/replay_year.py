"""A year of a large machine, replayed: events per second and wall time (issue 39).

Goal: the whole year of ALCF Theta (4,360 nodes, about 45,000 job starts and ends)
replays with ``--solver dp`` in under 5 minutes at the default P_jmax (10) and in under
10 minutes at 100 trainers at once, on this machine's 2 cores.

Each run is the ``bftrainer replay`` command itself, timed from the outside (trace
loading, the replay and its output files and plots: what a centre waits for), and the
replay loop's own ``wall_s`` from its summary.json, with the command's CPU seconds
(``cpu_s``) and the load average before and after it: on shared cores the CPU time is
the honest figure, the wall time says what the load left. Workloads:

- ``paper``: the BFTrainer paper's 1,000 ShuffleNet trials (``hps-shufflenet-Jbnd-1000J``,
  February 2021 dates; needs ``../shared/data``). The replay ends once all are done
  (about two days of a 4,360-node machine), so it measures the busy start, not the year.
- ``stream``: the built-in hpo workload (ShuffleNet trials, one every 36 s as in the
  paper; ``--interval``) with enough trials to arrive through the whole trace: the replay
  covers every pool event, and more trainers wait than run (the loop's queue grows all
  year). On Theta's real year (8,720 h) one every 36 s is 872,000 trials; one every 90 s
  (349,000, 40 an hour) is what ten trainers at 64 nodes could finish at most.

    python benchmarks/replay_year.py [PATH] [--workloads paper,stream] [--trainers 10,100]
                                     [--hours H] [--interval S] [--command CMD]
                                     [--label L] [--out FILE]

PATH: a pool trace, or a scheduler's job log once ``bftrainer replay`` reads those.
Default: the synthetic stand-in, ``bftrainer trace synth --nodes 4360 --hours 700
--seed 0`` (45,956 pool events), written to benchmarks/results/ when absent.
``--command`` times another ``bftrainer`` (e.g. a copy of the code before a change) in
the same session: figures from one session only are comparable on shared cores.
``--vs CMD`` runs CMD's replay at the same time as each of ``--command``'s, one a core:
both see the same load, and ``cpu_ratio`` (the command's CPU seconds over CMD's) is
the figure to read. Runs one after the other on these shared cores differed by 10-20%
with the same code (docs/benchmarks.md, "A year at 4,360 nodes").
Figures, not a timed test: JSON on stdout and in benchmarks/results/replay_year.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

DEFAULT_TRACE = Path("benchmarks/results/year_standin.csv.gz")
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "bftrainer-traces"
PAPER_JOBS = "hps-shufflenet-Jbnd-1000J.csv"
STREAM_INTERVAL_S = 36.0
GOAL_S = {10: 300.0, 100: 600.0}
FIELDS = (
    "hours",
    "events",
    "decisions",
    "trainers_arrived",
    "trainers_completed",
    "utilization_efficiency",
    "rescale_cost_samples",
    "preemption_cost_samples",
    "wall_s",
    "events_per_s",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", type=Path, default=DEFAULT_TRACE)
    ap.add_argument(
        "--data", type=Path, default=Path(os.environ.get("BFTRAINER_SHARED_DATA", DEFAULT_DATA))
    )
    ap.add_argument("--workloads", default="paper,stream")
    ap.add_argument("--trainers", default="10,100", help="P_jmax values (--max-parallel)")
    ap.add_argument(
        "--command",
        default=f"{shlex.quote(sys.executable)} -m bftrainer",
        help="the bftrainer command to time",
    )
    ap.add_argument("--vs", help="another bftrainer command, run alongside each replay")
    ap.add_argument("--hours", type=float, help="stream: replay only the trace's first H hours")
    ap.add_argument(
        "--interval", type=float, default=STREAM_INTERVAL_S, help="stream: s between trials"
    )
    ap.add_argument("--label", default="", help="names this set of figures in the JSON")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/replay_year.json"))
    args = ap.parse_args()
    command = shlex.split(args.command)
    if args.path == DEFAULT_TRACE and not DEFAULT_TRACE.exists():
        DEFAULT_TRACE.parent.mkdir(parents=True, exist_ok=True)
        synth = ["trace", "synth", "--nodes", "4360", "--hours", "700", "--seed", "0"]
        subprocess.run([*command, *synth, "--out", str(DEFAULT_TRACE)], check=True)
    stats = json.loads(
        subprocess.run(
            [*command, "trace", "stats", str(args.path), "--json"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    runs: dict[str, dict[str, object]] = {}
    for workload in args.workloads.split(","):
        options = workload_options(workload, args.data, stats, args.hours, args.interval)
        if options is None:
            print(f"skipped {workload}: {args.data / PAPER_JOBS} is absent", flush=True)
            continue
        if args.hours and workload == "stream":  # the paper's set ends on its own
            end = datetime.fromisoformat(str(stats["start"])) + timedelta(hours=args.hours)
            options += ["--end", end.strftime("%Y-%m-%dT%H:%M:%S")]
        for p in (int(x) for x in args.trainers.split(",")):
            name = f"{workload}-P{p}"
            vs = [] if args.vs is None else [shlex.split(args.vs)]
            rows = run_once([command, *vs], args.path, options, p)
            for suffix, row in zip(("", "-vs"), rows, strict=False):
                runs[name + suffix] = row
                print(name + suffix, json.dumps(row), flush=True)
    result = {
        "label": args.label,
        "path": str(args.path),
        "command": args.command,
        "vs": args.vs,
        "trace": {k: stats.get(k) for k in ("nodes", "duration_h", "events", "eq_nodes")},
        "hours": args.hours,
        "interval_s": args.interval,
        "goals_s": GOAL_S,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


def workload_options(
    workload: str,
    data: Path,
    stats: dict[str, object],
    hours: float | None,
    interval_s: float = STREAM_INTERVAL_S,
) -> list[str] | None:
    """The replay's workload options; None when the paper's set is absent."""
    if workload == "paper":
        jobs = data / PAPER_JOBS
        return ["--jobs", str(jobs)] if jobs.exists() else None
    if workload == "stream":
        hours = hours or float(stats["duration_h"])  # type: ignore[arg-type]
        count = math.ceil(hours * 3600 / interval_s) + 1
        interval = f"{interval_s:g}"
        return ["--workload", "hpo", "--jobs-count", str(count), "--interval", interval]
    raise SystemExit(f"--workloads: unknown workload {workload!r} (paper, stream)")


def run_once(
    commands: list[list[str]], path: Path, options: list[str], p: int
) -> list[dict[str, object]]:
    """Each command's ``bftrainer replay`` (milp, dp), all started at once, each timed
    (wall time to its own end, its own CPU seconds); their summaries' figures. With two
    commands, the first's row has ``cpu_ratio``: its CPU seconds over the second's."""
    with tempfile.TemporaryDirectory(prefix="replay-year-") as tmp:
        load = os.getloadavg()[0]
        started: dict[int, tuple[int, subprocess.Popen[bytes], Path, float]] = {}
        rows: list[dict[str, object]] = [{} for _ in commands]
        cpu_s = [0.0 for _ in commands]
        try:
            for i, command in enumerate(commands):
                out = Path(tmp) / f"out{i}"
                argv = [*command, "replay", str(path), *options, "--policy", "milp"]
                argv += ["--solver", "dp", "--max-parallel", str(p), "--no-progress"]
                proc = subprocess.Popen([*argv, "--out", str(out)], stdout=subprocess.DEVNULL)
                started[proc.pid] = (i, proc, out, time.perf_counter())
            while started:
                # Whichever ends first, with its own CPU seconds (RUSAGE_CHILDREN sums all).
                pid, status, usage = os.wait4(-1, 0)
                i, proc, out, t0 = started.pop(pid)
                command_s = time.perf_counter() - t0
                proc.returncode = os.waitstatus_to_exitcode(status)
                if proc.returncode:
                    raise SystemExit(f"{' '.join(commands[i])}: replay exited {proc.returncode}")
                summary = json.loads((out / "summary.json").read_text())
                row: dict[str, object] = {k: summary.get(k) for k in FIELDS}
                row["command_s"] = command_s
                # The cores are shared: CPU seconds are the figure the load moves least.
                cpu_s[i] = usage.ru_utime + usage.ru_stime
                row["cpu_s"] = cpu_s[i]
                row["load_before"], row["load_after"] = load, os.getloadavg()[0]
                row["goal_s"] = GOAL_S.get(p)
                rows[i] = row
        finally:
            for _, proc, _, _ in started.values():  # a failed or interrupted pair's other
                proc.kill()
                proc.wait()
    if len(commands) == 2:
        rows[0]["cpu_ratio"] = cpu_s[0] / cpu_s[1]
    return rows


if __name__ == "__main__":
    main()
