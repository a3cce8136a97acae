"""Decision latency of the window-aware allocator (milp/windows.py) against the same
instance without windows, in one run.

Instances: ``benchmarks/allocator.py``'s random events (Table 2 curves, n_max 8-64, a
current map that is not optimal, 5% of the nodes replaced), with windows: a share of
the pool leaves within T_fwd at a few shared instants (jobs of the main scheduler take
nodes in groups), the rest is open-ended. Reports median, p95 and max in ms, and the
window-aware V gained over the window-free answer valued with the windows.

    python benchmarks/windows.py [--sizes 10x200,30x800] [--seeds 20] [--share 0.1]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from allocator import percentile, random_instance  # type: ignore[import-not-found]

from bftrainer.milp import Problem, allocate
from bftrainer.milp.objective import build_terms
from bftrainer.milp.window_value import total_value
from bftrainer.milp.windows import node_windows

T_FWD_S = 120.0
GOAL_MS = 100.0  # a decision at 30 x 800, windows known: well under this


def with_windows(problem: Problem, share: float, seed: int) -> Problem:
    """``share`` of the pool leaves within T_fwd, in groups of 1-32 nodes at 8 instants."""
    rng = np.random.default_rng(1000 + seed)
    instants = rng.uniform(0.05, 1.0, size=8) * T_FWD_S
    leaving = rng.permutation(len(problem.pool))[: int(share * len(problem.pool))]
    windows = {problem.pool[i]: float(instants[rng.integers(8)]) for i in leaving}
    return replace(problem, t_fwd_s=T_FWD_S, windows_s=windows)


def run(sizes: list[tuple[int, int]], seeds: int, share: float, solver: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for trainers, nodes in sizes:
        plain_ms, aware_ms, gains = [], [], []
        for seed in range(seeds):
            problem = replace(random_instance(trainers, nodes, seed), t_fwd_s=T_FWD_S)
            windowed = with_windows(problem, share, seed)
            t0 = time.perf_counter()
            plain = allocate(problem, solver=solver)
            t1 = time.perf_counter()
            aware = allocate(windowed, solver=solver)
            t2 = time.perf_counter()
            plain_ms.append(1e3 * (t1 - t0))
            aware_ms.append(1e3 * (t2 - t1))
            terms = build_terms(windowed)
            w = node_windows(windowed)
            blind = total_value(terms, plain.nodes, w, T_FWD_S)
            gains.append((aware.objective - blind) / max(abs(blind), 1.0))
        out[f"{trainers}x{nodes}"] = {
            "without_windows": _stats(plain_ms),
            "with_windows": _stats(aware_ms),
            "value_gain_median": statistics.median(gains),
            "value_gain_min": min(gains),
        }
    return out


def _stats(ms: list[float]) -> dict[str, float]:
    return {
        "median_ms": statistics.median(ms),
        "p95_ms": percentile(ms, 95),
        "max_ms": max(ms),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10x200,30x800")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--share", type=float, default=0.1, help="share of the pool that leaves")
    ap.add_argument("--solver", default="dp")
    ap.add_argument("--out", default="benchmarks/results/windows.json")
    args = ap.parse_args()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    result = {
        "machine": platform.processor() or platform.machine(),
        "solver": args.solver,
        "share_leaving": args.share,
        "t_fwd_s": T_FWD_S,
        "goal_ms_30x800": GOAL_MS,
        "sizes": run(sizes, args.seeds, args.share, args.solver),  # type: ignore[arg-type]
    }
    text = json.dumps(result, indent=2)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
