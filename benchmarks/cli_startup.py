"""How long `bftrainer status` and `bftrainer --help` take, as ratios to `python -c pass`.

Both run often: a user on a busy login node, every wait of a script around the daemon.
The three commands alternate, each run a fresh process as a user's shell starts it, so
drift on a shared machine hits all alike; the median of each is reported, and the goal
(on an idle machine: 0.3 s for ``--help``, 0.2 s for ``status``, issue 42) is checked
on the medians. Beside the wall time, the CPU time the process used (user + system, from
``getrusage``): on an idle machine the wall time is about that, and unlike the wall time
it does not grow with other work on a shared one, so the goal is checked on both.
``status`` reads an empty store (the import cost, which is what grows with the code; its
reads are milliseconds).

    python benchmarks/cli_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bftrainer.state import Store, ensure_state_dir

GOAL_S = {"bftrainer --help": 0.3, "bftrainer status": 0.2}


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one fresh process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = ensure_state_dir(Path(tmp) / "state")
        with Store.open(state):
            pass
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "bftrainer --help": [sys.executable, "-m", "bftrainer", "--help"],
            "bftrainer status": [
                sys.executable,
                "-m",
                "bftrainer",
                "status",
                "--state-dir",
                str(state),
            ],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, argv in commands.items():
                wall_s, cpu_s = timed(argv)
                times[name].append(wall_s)
                cpu[name].append(cpu_s)
    base = statistics.median(times["python -c pass"])
    result = {}
    for name, runs in times.items():
        median = statistics.median(runs)
        cpu_median = statistics.median(cpu[name])
        result[name] = {
            "median_s": round(median, 3),
            "cpu_median_s": round(cpu_median, 3),
            "ratio_to_python": round(median / base, 2),
        }
        goal = ""
        if not name.startswith("python"):
            verdicts = ["met" if v <= GOAL_S[name] else "MISSED" for v in (median, cpu_median)]
            goal = f"  (goal {GOAL_S[name]} s: wall {verdicts[0]}, CPU {verdicts[1]})"
        print(
            f"{name:18s} {median:6.3f} s wall  {cpu_median:6.3f} s CPU"
            f"  {median / base:5.1f}x python -c pass{goal}"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
