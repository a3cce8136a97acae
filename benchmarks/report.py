"""``bftrainer report`` and ``bftrainer.report.frames``: time, memory and size, in one run.

Replays the demo (``make demo``'s replay: 512 synthetic nodes, a day, 1,000 trials, milp
and equal) and, when the data is here, the Summit week (1,024 nodes, the 1,000-trial
ShuffleNet set, milp with the dp solver, T_fwd 120 s); then runs ``bftrainer report``
on each as a user does, in a child process, and measures its wall and CPU time and its
peak memory (the child's maximum resident set), the page's size, and how long the
frames of the largest run take to load. Goals (issue 20): the demo's report <= 5 s;
the Summit week's <= 30 s and <= 2 GB; the page < 5 MB; the week's frames <= 3 s. The
report's time is also given as a share of the replay's, measured in the same run.

    python benchmarks/report.py [--data DIR] [--keep DIR]

The Summit data is not part of bftrainer (no licence): without it only the demo runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "bftrainer-traces"
GOALS = {"demo_report_s": 5.0, "week_report_s": 30.0, "week_report_gb": 2.0, "page_mb": 5.0}
GOAL_FRAMES_S = 3.0
LOAD_FRAMES = """
import sys, time
t0 = time.perf_counter()
from bftrainer.report.frames import load_replay
t1 = time.perf_counter()
f = load_replay(sys.argv[1])
t2 = time.perf_counter()
print(t1 - t0, t2 - t1, len(f.events), len(f.allocations), len(f.trainers))
"""


def measured(args: list[str]) -> dict[str, Any]:
    """Run a command; its wall and CPU seconds and peak memory (this child's alone)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(args, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(args)} failed: {err.read().strip()}")
        return {
            "wall_s": wall,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "max_rss_mb": usage.ru_maxrss / 1024,  # Linux: kilobytes
            "stdout": out.read().strip(),
        }


def bftrainer(*args: str) -> list[str]:
    return [sys.executable, "-m", "bftrainer", *args]


def case(name: str, replay_args: list[str], work: Path) -> dict[str, Any]:
    out = work / name
    replay = measured(bftrainer("replay", *replay_args, "--no-progress", "--out", str(out)))
    report = measured(bftrainer("report", str(out)))
    page = Path(report["stdout"])
    runs = sorted(p.parent for p in out.glob("*/summary.json")) or [out]
    biggest = max(runs, key=lambda r: (r / "events.csv").stat().st_size)
    frames = subprocess.run(
        [sys.executable, "-c", LOAD_FRAMES, str(biggest)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {
        "replay_wall_s": replay["wall_s"],
        "replay_cpu_s": replay["cpu_s"],
        "report_wall_s": report["wall_s"],
        "report_cpu_s": report["cpu_s"],
        "report_max_rss_mb": report["max_rss_mb"],
        "report_share_of_replay_cpu": report["cpu_s"] / replay["cpu_s"],
        "page_mb": page.stat().st_size / 2**20,
        "pngs": len(list(page.parent.glob("*.png"))),
        "frames_run": biggest.name,
        "frames_import_s": float(frames[0]),
        "frames_load_s": float(frames[1]),
        "events": int(frames[2]),
        "allocation_changes": int(frames[3]),
        "trainers": int(frames[4]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", type=Path, default=Path(os.environ.get("BFTRAINER_SHARED_DATA", DEFAULT_DATA))
    )
    ap.add_argument("--keep", type=Path, help="keep the replays and reports in this folder")
    ap.add_argument("--out", default="benchmarks/results/report.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bftrainer-bench-report-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results: dict[str, Any] = {"demo": case("demo", ["--policy", "milp,equal"], work)}
        trace = args.data / "summit_week1_node_events.csv.gz"
        jobs = args.data / "hps-shufflenet-Jbnd-1000J.csv"
        if trace.exists() and jobs.exists():
            week = [str(trace), "--nodes", "0:1024", "--jobs", str(jobs), "--policy", "milp"]
            week += ["--solver", "dp", "--tfwd", "120"]
            results["summit_week"] = case("summit-week", week, work)
        else:
            print(f"summit week skipped: {trace} or {jobs} is absent", file=sys.stderr)
    demo, week = results["demo"], results.get("summit_week")
    goals = {
        "demo_report_s": (demo["report_wall_s"], GOALS["demo_report_s"]),
        "page_mb": (max(r["page_mb"] for r in (demo, week) if r), GOALS["page_mb"]),
    }
    if week:
        goals["week_report_s"] = (week["report_wall_s"], GOALS["week_report_s"])
        goals["week_report_gb"] = (week["report_max_rss_mb"] / 1024, GOALS["week_report_gb"])
        goals["week_frames_s"] = (week["frames_load_s"], GOAL_FRAMES_S)
    results["goals"] = {k: {"measured": m, "goal": g, "met": m <= g} for k, (m, g) in goals.items()}
    results["machine"] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "bench_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    for name, r in results.items():
        print(name, json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
