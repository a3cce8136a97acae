"""How long `bftrainer status` and `bftrainer --help` take, as ratios to `python -c pass`.

Both run often: a user on a busy login node, every wait of a script around the daemon.
The three commands alternate, each run a fresh process as a user's shell starts it, so
drift on a shared machine hits all alike; the median of each is reported, and the goal
(on an idle machine: 0.3 s for ``--help``, 0.2 s for ``status``, issue 42) is checked
on the medians. ``status`` reads an empty store (the import cost, which is what grows
with the code; its reads are milliseconds).

    python benchmarks/cli_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bftrainer.state import Store, ensure_state_dir

GOAL_S = {"bftrainer --help": 0.3, "bftrainer status": 0.2}


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - t0


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
        for _ in range(args.runs):
            for name, argv in commands.items():
                times[name].append(timed(argv))
    base = statistics.median(times["python -c pass"])
    result = {}
    for name, runs in times.items():
        median = statistics.median(runs)
        result[name] = {"median_s": round(median, 3), "ratio_to_python": round(median / base, 2)}
        goal = (
            ""
            if name.startswith("python")
            else f"  (goal {GOAL_S[name]} s: {'met' if median <= GOAL_S[name] else 'MISSED'})"
        )
        print(f"{name:18s} {median:6.3f} s  {median / base:5.1f}x python -c pass{goal}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
