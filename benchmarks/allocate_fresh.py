"""`bftrainer allocate --json` from a fresh process: the `solve_s` it reports.

The 30 x 800 instance of benchmarks/allocator.py (Table 2 curves, n_max 64, an event on
a consistent map), written as PROBLEM.json and solved by a new `bftrainer allocate`
process each time, as a user runs it. Goal (issue 42): `solve_s` <= 10 ms with the
default solver: the solve alone, not the imports a fresh process does on the way.
Prints and writes JSON (median and spread of `solve_s`, and of the process's wall time).
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.allocator import instance  # noqa: E402


def problem_json(trainers: int, nodes: int, seed: int) -> dict[str, object]:
    p = instance(trainers, nodes, seed)
    return {
        "pool": list(p.pool),
        "max_trainers": p.max_trainers,
        "trainers": [
            {
                "id": t.id,
                "n_min": t.n_min,
                "n_max": t.n_max,
                "rescale_up": t.rescale_up_s,
                "rescale_down": t.rescale_down_s,
                "curve": [list(c) for c in t.curve],
                "nodes": list(t.nodes),
            }
            for t in p.trainers
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="30x800")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/allocate_fresh.json"))
    args = ap.parse_args()
    trainers, nodes = (int(x) for x in args.size.split("x"))
    command = [sys.executable, "-m", "bftrainer", "allocate", "PROBLEM", "--json"]
    command += ["--solver", str(args.solver)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "problem.json"
        path.write_text(json.dumps(problem_json(trainers, nodes, seed=0)))
        solve, wall = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = subprocess.run(
                [str(path) if c == "PROBLEM" else c for c in command],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            wall.append(time.perf_counter() - t0)
            solve.append(json.loads(out)["solve_s"])
    result = {
        "size": args.size,
        "solver": args.solver,
        "solve_s_median": statistics.median(solve),
        "solve_s_min": min(solve),
        "solve_s_max": max(solve),
        "process_wall_s_median": statistics.median(wall),
        "goal_solve_s": 0.010,
    }
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
