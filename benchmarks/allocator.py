"""Allocator solve time per (trainers, nodes), formulation and solver, in one run.

Instances: Table 2 curves cycled over the trainers, n_min 1, n_max 64, costs as the
paper's job sets; a consistent current allocation (the optimum on the pool), then an
event (5% of the nodes leave, as many join). Reports the median of repeats and the
node/count time ratio measured in the same run, as JSON (benchmarks/results/).

    python benchmarks/allocator.py [--sizes 10x100,30x800,100x4608] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bftrainer.milp import Problem, TrainerSpec, allocate
from bftrainer.milp.solvers import SolverError
from bftrainer.replay.zoo import ZOO_SPS, zoo_curve

# (formulation, solver); the node model at full-Summit size has 460,800 binaries and is
# left out there (the paper's point: it does not scale).
COMBOS = [
    ("count", "dp"),
    ("count", "highs"),
    ("count", "cbc"),
    ("count", "gurobi"),
    ("node", "highs"),
    ("node", "cbc"),
    ("node", "gurobi"),
]
NODE_MAX_VARS = 30 * 800
GOALS_MS = {
    ("30x800", "count", "highs"): 50,
    ("30x800", "count", "dp"): 10,
    ("100x4608", "count", "highs"): 500,
    ("100x4608", "count", "dp"): 100,
}


def instance(trainers: int, nodes: int, seed: int) -> Problem:
    rng = np.random.default_rng(seed)
    models = list(ZOO_SPS)
    specs = [
        TrainerSpec(
            id=f"t{j}",
            n_min=1,
            n_max=64,
            rescale_up_s=float(rng.uniform(17, 19)),
            rescale_down_s=float(rng.uniform(11, 13)),
            curve=zoo_curve(models[j % len(models)]),
        )
        for j in range(trainers)
    ]
    pool = tuple(f"n{i}" for i in range(nodes))
    first = Problem(pool=pool, trainers=tuple(specs), max_trainers=trainers)
    placed = allocate(first, solver="dp").nodes
    specs = [TrainerSpec(**{**s.__dict__, "nodes": placed[s.id]}) for s in specs]
    k = max(1, nodes // 20)
    left = set(rng.choice(nodes, size=k, replace=False).tolist())
    new_pool = tuple(n for i, n in enumerate(pool) if i not in left) + tuple(
        f"j{i}" for i in range(k)
    )
    return Problem(pool=new_pool, trainers=tuple(specs), max_trainers=trainers)


def measure(
    problem: Problem, formulation: str, solver: str, repeats: int, limit_s: float
) -> dict[str, Any]:
    times, objective, status = [], None, None
    for _ in range(repeats):
        start = time.perf_counter()
        try:
            result = allocate(problem, formulation=formulation, solver=solver, time_limit_s=limit_s)
        except SolverError as e:
            return {"error": str(e).split(":")[0]}
        times.append(time.perf_counter() - start)
        objective, status = result.objective, result.status
    return {
        "median_s": statistics.median(times),
        "runs": repeats,
        "objective": objective,
        "status": status,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10x100,30x800,100x4608")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--node-repeats", type=int, default=3, help="repeats of the slow node model")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/allocator.json"))
    args = ap.parse_args()
    results: dict[str, Any] = {
        "machine": platform.platform(),
        "time_limit_s": args.time_limit,
        "sizes": {},
    }
    for size in args.sizes.split(","):
        trainers, nodes = map(int, size.split("x"))
        problem = instance(trainers, nodes, seed=1)
        row: dict[str, Any] = {}
        for formulation, solver in COMBOS:
            key = f"{formulation}/{solver}"
            if formulation == "node" and trainers * nodes > NODE_MAX_VARS:
                row[key] = {"skipped": f"{trainers * nodes} binaries"}
                continue
            reps = args.node_repeats if formulation == "node" else args.repeats
            row[key] = measure(problem, formulation, solver, reps, args.time_limit)
            print(size, key, row[key], flush=True)
        for solver in ("highs", "cbc", "gurobi"):
            n, c = row.get(f"node/{solver}", {}), row.get(f"count/{solver}", {})
            if "median_s" in n and "median_s" in c:
                row[f"node_over_count_{solver}"] = n["median_s"] / c["median_s"]
        for (gsize, formulation, solver), goal_ms in GOALS_MS.items():
            got = row.get(f"{formulation}/{solver}", {})
            if gsize == size and "median_s" in got:
                row[f"goal_{formulation}_{solver}_ms"] = {
                    "goal": goal_ms,
                    "measured": got["median_s"] * 1000,
                    "met": got["median_s"] * 1000 <= goal_ms,
                }
        objectives = {
            round(v["objective"], 3)
            for v in row.values()
            if isinstance(v, dict) and v.get("status") == "optimal"
        }
        row["optimal_objectives_agree"] = len(objectives) <= 1
        results["sizes"][size] = row
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
